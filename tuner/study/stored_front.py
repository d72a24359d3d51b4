"""A stored study's front, ready to time again: its points' architectures rebuilt untrained
under the study's own config and protocol, as the scripts that re-time a front
(`scripts/retime_front.py`, `scripts/bench_steadiness.py`) need them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from tuner import console
from tuner.config import compose_config
from tuner.data import ExampleInputs, load_splits
from tuner.front import Constraints, study_points
from tuner.latency import LatencyProtocol
from tuner.store import LatencyTable, settings_of, stored_settings
from tuner.study.confirmation import Rebuilder, Target, target_of
from tuner.study.preparation import (
    first_calibration_inputs,
    modality_for,
    prepare,
    protocol_record_of,
)
from tuner.tracking import override_keys
from tuner.trial import ModelFactory


@dataclass(frozen=True)
class StudyFront:
    """A study's front ready to rebuild: the study, its latency table and protocol, the timed
    input, the rebuilder and one target per front point."""

    study: optuna.Study
    table: LatencyTable
    protocol: LatencyProtocol
    example: ExampleInputs
    rebuilder: Rebuilder
    targets: list[Target]


def study_front(overrides: Sequence[str]) -> StudyFront:
    """The front of the study the overrides compose (read from its storage, nothing written)."""
    console.quiet_libraries()
    prepared = prepare(compose_config(list(overrides)), {}, override_keys(list(overrides)))
    cfg = prepared.cfg
    study = optuna.load_study(study_name=str(cfg.study.name), storage=str(cfg.study.storage))
    splits = load_splits(cfg.data)
    modality = modality_for(cfg, prepared.space, splits)
    protocol = LatencyProtocol.from_config(cfg.deploy.latency)
    example = modality.example(splits.val.items, protocol)
    rebuilder = Rebuilder(
        cfg,
        ModelFactory(splits.num_labels),
        example,
        first_calibration_inputs(modality, splits.train, int(cfg.deploy.calibration_samples)),
        protocol_record_of(cfg, protocol, example),
    )
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    # The front under the study's own constraints (those of this command line for a study
    # made by a version that kept no settings).
    constraints = Constraints.of_settings(stored_settings(study) or settings_of(cfg))
    targets = [
        target_of(trials[p.trial_number], p.backend)
        for p in study_points(study, constraints)
        if p.pareto
    ]
    return StudyFront(
        study, LatencyTable.of_attrs(study.user_attrs), protocol, example, rebuilder, targets
    )

"""A study prepared before its first trial: the config resolved and checked with its search
space, the data loaded into its modality's input pipeline, the backends this machine runs,
the study opened in its storage and tracking, and the inputs every trial shares (the timed
example, the calibration batches, the latency protocol's record).

Every check that can fail runs here, so a bad config fails before anything trains.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Collection, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import optuna
import torch
from omegaconf import DictConfig

from tuner import console
from tuner.config import (
    SearchSpace,
    apply_debug,
    candidate_values,
    load_search_space,
    resolve,
    with_params,
)
from tuner.data import Encoded, ExampleInputs, Examples, Splits, load_splits
from tuner.edits import EDITS, SAME_EDIT
from tuner.errors import ConfigError
from tuner.front import Constraints
from tuner.keys import BACKEND_KEY
from tuner.latency import LatencyProtocol, forget_readings, gpu_record, machine_name
from tuner.modalities import MODALITIES, Modality
from tuner.models import MODEL_FAMILIES
from tuner.store import Leases
from tuner.study.backends import (
    backends_typed_win,
    check_backends,
    deploy_only_on,
    deployment_backends,
    runnable_backends,
)
from tuner.study.checks import check_config
from tuner.study.opening import check_same_space, open_study, settle_settings
from tuner.tracking import Tracker, override_keys
from tuner.trial import ModelFactory, Teachers, teachers_for


@dataclass(frozen=True)
class Prepared:
    """A checked config and its search space, with where each searched key is defined (for
    errors); nothing has been created yet."""

    cfg: DictConfig
    space: SearchSpace
    sources: Mapping[str, str]


def prepare(
    raw_cfg: DictConfig, sources: Mapping[str, str], pinned: Collection[str] = ()
) -> Prepared:
    """Apply the debug profile, resolve, parse the search space and check every value.

    Args:
        sources: search-space key -> file that defines it, named in errors.
        pinned: keys set on the command line; they are fixed, not searched.
    """
    cfg = resolve(apply_debug(raw_cfg, pinned))
    space = _typed_edits_win(load_search_space(cfg, sources, pinned), pinned)
    space, backends_from = backends_typed_win(cfg, space, pinned)
    if backends_from is not None:
        sources = {**sources, BACKEND_KEY: backends_from}
    cfg = with_params(cfg, space.fixed)
    check_config(cfg, space, sources)
    return Prepared(cfg, space, sources)


def _typed_edits_win(space: SearchSpace, pinned: Collection[str]) -> SearchSpace:
    """An edit typed on the command line in one form (`model.ffn_width=1024`) fixes it: the
    experiment's search over its other form (`model.ffn_width_fraction`) is dropped, with a
    line saying so."""
    dropped = set()
    for pair in SAME_EDIT:
        for typed, other in (pair, pair[::-1]):
            if f"model.{typed}" in pinned and f"model.{other}" in space.distributions:
                dropped.add(f"model.{other}")
                console.console.print(
                    f"model.{typed} is set on the command line, so model.{other} is not searched"
                )
    if not dropped:
        return space
    kept = {key: d for key, d in space.distributions.items() if key not in dropped}
    return replace(space, distributions=kept)


@dataclass(frozen=True)
class StudyData:
    """The data and what is made from it before any trial: the splits, the modality's input
    pipeline, the model factory, the latency protocol and the input it times."""

    splits: Splits
    modality: Modality
    factory: ModelFactory
    protocol: LatencyProtocol
    example: ExampleInputs


def load_data(prepared: Prepared) -> StudyData:
    """The splits and their modality, with the searched edits tried on the model, and one line
    on the data (another where examples were dropped)."""
    cfg = prepared.cfg
    splits = load_splits(cfg.data)
    modality = modality_for(cfg, prepared.space, splits)
    factory = ModelFactory(splits.num_labels)
    _check_edits(factory, prepared)
    protocol = LatencyProtocol.from_config(cfg.deploy.latency)
    example = modality.example(splits.val.items, protocol)
    console.console.print(
        f"Data: {len(splits.train)} train / {len(splits.val)} validation "
        f"examples, labels {splits.label_names} ({splits.origin})"
    )
    if splits.dropped:
        console.console.print(f"[yellow]Dropped {splits.dropped} (data.drop_empty=true)[/]")
    return StudyData(splits, modality, factory, protocol, example)


def _check_edits(factory: ModelFactory, prepared: Prepared) -> None:
    """Apply each edit, at every value it is searched over or the one it is set to, to a copy
    of the model, so that bad widths, depths and head counts fail now."""
    for pair in SAME_EDIT:
        given = [
            f"model.{key}"
            for key in pair
            if f"model.{key}" in prepared.space.distributions
            or prepared.cfg.model.get(key) is not None
        ]
        if len(given) > 1:
            raise ConfigError(
                f"Invalid config: keys {' and '.join(given)} set one edit two ways; set one "
                "of them (and the other to null)"
            )
    model = factory.build(prepared.cfg.model, int(prepared.cfg.train.seed))
    for name in EDITS:
        edit = EDITS.get(name)
        key = f"model.{edit.config_key}"
        if key in prepared.space.distributions:
            values = candidate_values(prepared.space.distributions[key])
        else:
            typed = prepared.cfg.model.get(edit.config_key)
            values = [] if typed is None else [typed]
        for value in values:
            edit.apply(copy.deepcopy(model), value)


def modality_for(cfg: DictConfig, space: SearchSpace, splits: Splits) -> Modality:
    """The data's input pipeline, once the model family is known to read that modality."""
    family = MODEL_FAMILIES.get(str(cfg.model.family))
    if family.modality != splits.modality:
        raise ConfigError(
            f"Invalid config: key 'model.family': '{cfg.model.family}' models read "
            f"{family.modality}, but data.source '{cfg.data.source}' gives {splits.modality}"
        )
    modality_type = MODALITIES.get(splits.modality)
    modality_type.check(cfg, space)
    return modality_type.from_config(cfg, splits)


@dataclass(frozen=True)
class Ready:
    """A study ready for its trials: its checked config, its search space narrowed to the
    backends this machine runs (`left_out`: why each other one is not), its data, and the
    study opened in its storage and tracking."""

    cfg: DictConfig
    space: SearchSpace
    data: StudyData
    constraints: Constraints
    backends: list[str]
    left_out: dict[str, str]
    tracker: Tracker
    study: optuna.Study
    storage: optuna.storages.BaseStorage
    leases: Leases
    teachers: Teachers | None


def ready_study(
    raw_cfg: DictConfig, sources: Mapping[str, str], overrides: Sequence[str], lifetime: ExitStack
) -> Ready:
    """Prepare the config, load the data, choose the backends, open the study and check it
    against this run: every step that can refuse the run comes before any trial.

    Args:
        sources: search-space key -> file that defines it, named in errors.
        overrides: the command line's Hydra overrides; the keys they set are not searched.
        lifetime: closed when the run ends; what the run holds (a SQLite study's lease) until
            then.
    """
    prepared = prepare(raw_cfg, sources, override_keys(overrides))
    cfg, sources = prepared.cfg, prepared.sources
    torch.set_num_threads(int(cfg.train.num_threads or os.cpu_count() or 1))
    forget_readings()
    data = load_data(prepared)
    constraints = Constraints.from_config(cfg.study)
    listed = deployment_backends(cfg, prepared.space)
    check_backends(listed, data.modality.name, cfg.deploy, sources)
    backends, left_out = runnable_backends(listed, sources)
    space = deploy_only_on(prepared.space, backends)
    tracker = Tracker(str(cfg.tracking.uri), str(cfg.tracking.experiment))
    leases = Leases(str(cfg.study.storage), str(cfg.study.name))
    study, storage = open_study(cfg, tracker, leases, lifetime)
    check_same_space(study, space, sources, left_out)
    teachers = teachers_for(
        cfg, space, data.splits.label_names, study.get_trials(deepcopy=False), study.user_attrs
    )
    # Last of the checks, so that a change it records is one this run goes on with.
    settle_settings(study, cfg)
    return Ready(
        cfg, space, data, constraints, backends, left_out, tracker, study, storage, leases, teachers
    )


def protocol_record_of(
    cfg: DictConfig, protocol: LatencyProtocol, example: ExampleInputs
) -> dict[str, Any]:
    """The latency protocol, the machine (and GPU) it runs on and the timed input's shape, as
    logged on every run and made part of every latency key."""
    return {
        **protocol.record(prefix="latency."),
        **gpu_record(str(cfg.deploy.device), prefix="latency."),
        "latency.input_shape": example.shape(),
        "latency.machine": machine_name(cfg.deploy.get("machine")),
    }


_CALIBRATION_BATCH = 32


def calibration_inputs(train_data: Encoded, samples: int) -> list[tuple[torch.Tensor, ...]]:
    """The first training batches (in order, so every backend and trial sees the same), for
    backends that calibrate activation ranges."""
    batches = train_data.batches(_CALIBRATION_BATCH)
    return [batch.inputs for batch in itertools.islice(batches, -(-samples // _CALIBRATION_BATCH))]


def first_calibration_inputs(
    modality: Modality, train: Examples, samples: int
) -> list[tuple[torch.Tensor, ...]]:
    """`calibration_inputs` with only the training examples they hold encoded: for a process
    that needs no other training data (a measuring worker, a front timed again)."""
    first = -(-samples // _CALIBRATION_BATCH) * _CALIBRATION_BATCH
    return calibration_inputs(modality.encode(train.items[:first], train.labels[:first]), samples)

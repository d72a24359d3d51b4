"""A study from start to end: check everything, then create or resume it and run the trials."""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
import torch
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import CategoricalDistribution
from transformers import AutoTokenizer

from tuner import console
from tuner.checks import candidate_values, check_config
from tuner.config import (
    apply_debug,
    debug_profile_keys,
    load_search_space,
    resolve,
    with_params,
)
from tuner.constraints import Constraints, constraints_func
from tuner.convergence import convergence
from tuner.data import load_splits
from tuner.data.tokens import tokenize
from tuner.edits import EDITS
from tuner.errors import ConfigError
from tuner.front import Point, front_note, study_points
from tuner.latency import LatencyProtocol, example_inputs
from tuner.models import resolve_name_or_path
from tuner.retrain import override_keys
from tuner.samplers import SAMPLERS
from tuner.space import SearchSpace
from tuner.storage import open_storage
from tuner.tracking import Tracker
from tuner.trial import BACKEND_KEY, ModelFactory, Objective, ServingContext, TrialContext

DIRECTIONS = ("maximize", "minimize")
OBJECTIVES = ("val_accuracy", "latency_ms_p50")


@dataclass(frozen=True)
class Prepared:
    """A checked config and its search space; nothing has been created yet."""

    cfg: DictConfig
    space: SearchSpace


def prepare(
    raw_cfg: DictConfig, sources: Mapping[str, str], pinned: Collection[str] = ()
) -> Prepared:
    """Apply the debug profile, resolve, parse the search space and check every value.

    Args:
        sources: search-space key -> file that defines it, named in errors.
        pinned: keys set on the command line; they are fixed, not searched.
    """
    cfg = resolve(apply_debug(raw_cfg))
    space = load_search_space(cfg, sources, pinned)
    cfg = with_params(cfg, space.fixed)
    check_config(cfg, space, sources)
    return Prepared(cfg, space)


def deployment_backends(cfg: DictConfig, space: SearchSpace) -> list[str]:
    """Every backend a trained model is deployed on: the searched choices, or the one set."""
    distribution = space.distributions.get(BACKEND_KEY)
    if isinstance(distribution, CategoricalDistribution):
        return [str(choice) for choice in distribution.choices]
    return [str(cfg.deploy.backend)]


def _check_edits(factory: ModelFactory, prepared: Prepared) -> None:
    """Apply each searched edit at the ends of its range to a copy, so bad widths fail now."""
    model = factory.build(prepared.cfg.model, int(prepared.cfg.train.seed))
    for name in EDITS:
        edit = EDITS.get(name)
        key = f"model.{edit.config_key}"
        if key in prepared.space.distributions:
            for value in candidate_values(prepared.space.distributions[key]):
                edit.apply(copy.deepcopy(model), value)


def _create_study(
    cfg: DictConfig, constraints: Constraints
) -> tuple[optuna.Study, optuna.storages.BaseStorage]:
    url = str(cfg.study.storage)
    storage, existing = open_storage(url)
    resumed = str(cfg.study.name) in existing
    previous = 0
    if resumed:
        study_id = storage.get_study_id_from_name(str(cfg.study.name))
        previous = len(storage.get_all_trials(study_id, deepcopy=False))
    # A resumed study must not replay the first invocation's random draws.
    sampler = SAMPLERS.get(str(cfg.study.sampler))(
        int(cfg.study.seed) + previous, constraints_func if constraints.active else None
    )
    study = optuna.create_study(
        study_name=str(cfg.study.name),
        storage=storage,
        directions=list(DIRECTIONS),
        sampler=sampler,
        load_if_exists=True,
    )
    if study.directions != [optuna.study.StudyDirection[d.upper()] for d in DIRECTIONS]:
        raise ConfigError(
            f"Invalid config: key 'study.name': study '{study.study_name}' in {url} has "
            f"other objectives; choose another study.name"
        )
    study.set_metric_names(list(OBJECTIVES))
    state = "Resuming" if resumed else "Created"
    console.console.print(
        f"{state} study '{study.study_name}' ({previous} earlier trials) in {url}"
    )
    return study, storage


def run_study(
    raw_cfg: DictConfig, sources: Mapping[str, str] | None = None, overrides: Sequence[str] = ()
) -> list[Point]:
    """Run `study.n_trials` more trials; return the study's points, front flagged.

    Args:
        sources: search-space key -> file that defines it, named in errors.
        overrides: the command line's Hydra overrides; the keys they set are not searched, and
            they start each point's retraining command.
    """
    console.quiet_libraries()
    prepared = prepare(raw_cfg, sources or {}, override_keys(overrides))
    cfg, space = prepared.cfg, prepared.space
    torch.set_num_threads(int(cfg.train.num_threads or os.cpu_count() or 1))

    splits = load_splits(cfg.data)
    source = resolve_name_or_path(str(cfg.model.name_or_path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"Invalid config: key 'model.name_or_path': no tokenizer at '{source}': {exc}"
        ) from None
    edit_keys = {EDITS.get(name).config_key for name in EDITS}
    factory = ModelFactory(splits.num_labels, edit_keys)
    _check_edits(factory, prepared)
    protocol = LatencyProtocol.from_config(cfg.deploy.latency)
    console.console.print(
        f"Data: {len(splits.train)} train / {len(splits.val)} validation "
        f"examples, labels {splits.label_names} ({splits.origin})"
    )

    constraints = Constraints.from_config(cfg.study)
    backends = deployment_backends(cfg, space)
    study, storage = _create_study(cfg, constraints)
    tracker = Tracker(str(cfg.tracking.uri), str(cfg.tracking.experiment))
    protocol_record = protocol.record(prefix="latency.")
    parent_id = tracker.start_parent(
        study.study_name,
        {
            "study.n_trials": cfg.study.n_trials,
            "study.sampler": cfg.study.sampler,
            "search_space": ", ".join(space.keys),
            "deploy.backends": ", ".join(backends),
            "study.max_accuracy_drop": constraints.max_accuracy_drop,
            "study.latency_budget_ms": constraints.latency_budget_ms,
            **protocol_record,
        },
        OmegaConf.to_yaml(cfg),
    )

    def publish(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        points = study_points(study, constraints)
        progress = convergence(study, cfg.study.hypervolume_reference, points)
        step = len(study.get_trials(deepcopy=False))
        note = front_note(study.study_name, points, progress, protocol_record)
        tracker.publish_front(parent_id, study.study_name, points, note)
        if progress is not None:
            tracker.log_metrics(parent_id, progress.metrics(), step=step)

    with tempfile.TemporaryDirectory(prefix="tuner-tokenizer-") as tokenizer_dir:
        # Saved once: every logged model ships this tokenizer beside its backend artifact.
        tokenizer.save_pretrained(tokenizer_dir)
        context = TrialContext(
            cfg=cfg,
            space=space,
            backends=backends,
            constraints=constraints,
            train_data=tokenize(tokenizer, splits.train, int(cfg.data.max_length)),
            val_data=tokenize(tokenizer, splits.val, int(cfg.data.max_length)),
            example=example_inputs(tokenizer, splits.val.texts, protocol),
            protocol=protocol,
            factory=factory,
            tracker=tracker,
            parent_run_id=parent_id,
            n_trials=int(cfg.study.n_trials),
            storage=storage,
            study_id=storage.get_study_id_from_name(study.study_name),
            serving=ServingContext(
                tokenizer_dir=Path(tokenizer_dir),
                label_names=list(splits.label_names),
                example_texts=list(splits.val.texts[:2]),
                overrides=tuple(overrides),
                study_name=str(raw_cfg.study.name),
                profile_keys=frozenset(debug_profile_keys(raw_cfg)),
            ),
        )
        try:
            study.optimize(
                Objective(context),
                n_trials=int(cfg.study.n_trials),
                # A failing trial is recorded with its reason; the study goes on.
                catch=(Exception,),
                callbacks=[publish],
            )
        except KeyboardInterrupt:
            tracker.kill(parent_id)
            raise
        except BaseException:
            tracker.fail(parent_id, "the study stopped on an error; see the terminal")
            raise
    points = study_points(study, constraints)
    tracker.finish(parent_id)
    failed = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)))
    console.front_summary(study.study_name, points, failed)
    return points

"""A study from start to end: check everything, then create or resume it and run the trials."""

from __future__ import annotations

import copy
import itertools
import os
import socket
import tempfile
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
import torch
from omegaconf import DictConfig
from optuna.distributions import CategoricalDistribution, check_distribution_compatibility
from optuna.trial import TrialState

from tuner import console
from tuner.config import (
    SearchSpace,
    apply_debug,
    candidate_values,
    debug_profile_keys,
    load_search_space,
    resolve,
    with_params,
)
from tuner.data import Encoded, ExampleInputs, Splits, load_splits
from tuner.deploy import BACKENDS, unavailable_backends
from tuner.devices import resolve_device
from tuner.edits import EDITS, SAME_EDIT
from tuner.errors import ConfigError
from tuner.front import (
    REFERENCE_ATTR,
    Constraints,
    Point,
    PruningSettings,
    convergence,
    front_note,
    front_of,
    sampler_view,
    summarise_front,
)
from tuner.insight import MachinePeak
from tuner.interrupts import immediate, interruptible, raise_if_interrupted
from tuner.latency import (
    LatencyProtocol,
    forget_readings,
    gpu_record,
    objective_name,
    study_peak,
    unknown_cpu_notice,
)
from tuner.modalities import MODALITIES, Modality
from tuner.models import MODEL_FAMILIES
from tuner.secrets import mask_url, masked_yaml
from tuner.store import (
    BACKEND_KEY,
    DIRECTIONS,
    LATENCY_KEY_ATTR,
    FilteredSampler,
    Heartbeat,
    LatencyTable,
    Leases,
    budget,
    check_change_keys,
    is_sqlite,
    live_trial_numbers,
    open_storage,
    settings_of,
    settle,
    wait_out_unbeaten,
)
from tuner.study import messages
from tuner.study.checks import check_config, defined_in
from tuner.study.confirmation import Rebuilder, confirm_front, front_unconfirmed
from tuner.study.samplers import SAMPLERS
from tuner.study.stale_trials import StaleTrials, requeue_orphans
from tuner.study.teacher_trial import ensure_trained
from tuner.study.worker_loop import claimed_trial_runner, nothing_left, run_to_budget
from tuner.tracking import Tracker, override_keys
from tuner.trial import ModelFactory, Objective, ServingContext, TrialContext, teachers_for

DEPLOY_DEVICE_KEY = "deploy.device"


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
    cfg = resolve(apply_debug(raw_cfg, pinned))
    space = _typed_edits_win(load_search_space(cfg, sources, pinned), pinned)
    cfg = with_params(cfg, space.fixed)
    check_config(cfg, space, sources)
    return Prepared(cfg, space)


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


def deployment_backends(cfg: DictConfig, space: SearchSpace) -> list[str]:
    """Every backend a trained model is deployed on: the searched choices, or the one set."""
    distribution = space.distributions.get(BACKEND_KEY)
    if isinstance(distribution, CategoricalDistribution):
        return [str(choice) for choice in distribution.choices]
    return [str(cfg.deploy.backend)]


def _check_edits(factory: ModelFactory, prepared: Prepared) -> None:
    """Apply each searched edit at the ends of its range to a copy, so bad widths fail now."""
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
            for value in candidate_values(prepared.space.distributions[key]):
                edit.apply(copy.deepcopy(model), value)


def _worker_salt(url: str) -> int:
    """0 for SQLite (one worker); otherwise different per process, so that workers starting
    together on a server database do not all draw the same first configurations."""
    if is_sqlite(url):
        return 0
    return zlib.crc32(f"{socket.gethostname()}:{os.getpid()}".encode()) % 100_003


def _refuse_parallel_sqlite(url: str, storage: optuna.storages.BaseStorage, study_id: int) -> None:
    if not is_sqlite(url):
        return
    # A trial left running without a heartbeat (its worker died at once) is no live worker's.
    wait_out_unbeaten(storage, study_id)
    live = live_trial_numbers(storage, study_id)
    if live:
        raise ConfigError(
            f"Invalid config: key 'study.storage': another worker is running trial "
            f"#{live[0]} of this study in {url}. SQLite is not safe for parallel Optuna "
            "writers: give every worker a server database "
            "(study.storage=postgresql+psycopg://user@host/db) or Optuna's journal "
            "file (study.storage=journal:///shared/path/study.log, no server, but no "
            "heartbeats), or run one worker at a time. If that worker is dead, its trial is "
            "failed and queued again once it has sent no heartbeat for "
            "study.heartbeat.grace_period seconds."
        )


def _create_study(
    cfg: DictConfig, tracker: Tracker
) -> tuple[optuna.Study, optuna.storages.BaseStorage]:
    check_change_keys([str(key) for key in cfg.study.change_settings])
    url = str(cfg.study.storage)
    heartbeat = Heartbeat.from_config(cfg.study.heartbeat)
    leases = Leases(url, str(cfg.study.name))
    on_stale = StaleTrials(
        leases, tracker, int(cfg.study.heartbeat.max_retry), heartbeat.grace_period
    )
    storage, existing = open_storage(url, heartbeat, on_stale)
    resumed = str(cfg.study.name) in existing
    previous = 0
    if resumed:
        study_id = storage.get_study_id_from_name(str(cfg.study.name))
        _refuse_parallel_sqlite(url, storage, study_id)
        previous = len(storage.get_all_trials(study_id, deepcopy=False))
    # A resumed study must not replay the first invocation's random draws. The sampler learns
    # from trained configurations only: another backend's point of a model is a near-duplicate
    # that would use up its start-up trials. Pruned ones it sees as the poor points they are.
    sampler = FilteredSampler(
        SAMPLERS.get(str(cfg.study.sampler))(int(cfg.study.seed) + previous + _worker_salt(url)),
        budget.is_configuration,
        sampler_view,
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
            f"Invalid config: key 'study.name': study '{study.study_name}' in {mask_url(url)} "
            f"has other objectives; choose another study.name"
        )
    # Trials whose worker died long enough ago are failed and queued again before counting.
    optuna.storages.fail_stale_trials(study)
    state = "Resuming" if resumed else "Created"
    done = budget.trained(study.get_trials(deepcopy=False))
    console.console.print(
        f"{state} study '{study.study_name}' ({previous} earlier trials, {done} of "
        f"{cfg.study.n_trials} configurations trained or training) in {mask_url(url)}"
    )
    return study, storage


def run_study(
    raw_cfg: DictConfig, sources: Mapping[str, str] | None = None, overrides: Sequence[str] = ()
) -> list[Point]:
    """Run trials until the study holds `study.n_trials` trained configurations; return the
    study's points, front flagged.

    Args:
        sources: search-space key -> file that defines it, named in errors.
        overrides: the command line's Hydra overrides; the keys they set are not searched, and
            they start each point's retraining command.
    """
    console.quiet_libraries()
    prepared = prepare(raw_cfg, sources or {}, override_keys(overrides))
    cfg, space = prepared.cfg, prepared.space
    torch.set_num_threads(int(cfg.train.num_threads or os.cpu_count() or 1))
    forget_readings()

    splits = load_splits(cfg.data)
    modality = modality_for(cfg, space, splits)
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

    constraints = Constraints.from_config(cfg.study)
    listed = deployment_backends(cfg, space)
    check_backends(listed, modality.name, str(cfg.deploy.device), sources or {})
    backends, left_out = runnable_backends(listed, sources or {})
    space = _deploy_only_on(space, backends)
    tracker = Tracker(str(cfg.tracking.uri), str(cfg.tracking.experiment))
    study, storage = _create_study(cfg, tracker)
    leases = Leases(str(cfg.study.storage), study.study_name)
    check_same_space(study, space, sources or {}, left_out)
    teachers = teachers_for(
        cfg, space, splits.label_names, study.get_trials(deepcopy=False), study.user_attrs
    )
    # Last of the checks, so that a change it records is one this run goes on with.
    _settle_settings(study, cfg)
    n_trials = int(cfg.study.n_trials)
    finished = nothing_left(study, n_trials)
    protocol_record = protocol_record_of(cfg, protocol, example)
    # A finished study's run goes on only to confirm a front still short of sessions that it
    # can time here (one that met a long slow spell, or that a higher front_sessions asks
    # more of).
    if finished and not front_unconfirmed(
        study, constraints, protocol.front_sessions, cfg.deploy, protocol_record
    ):
        messages.budget_reached(study.study_name, n_trials)
        points = summarise_front(study, constraints)
        messages.review_hint(
            str(cfg.tracking.uri), tracker.experiment_id, None, objective_name(protocol.statistic)
        )
        return points
    if finished:
        messages.confirming_finished_front(study.study_name, n_trials)
    peak = machine_peak(study, protocol_record, protocol.num_threads)
    parent_id = tracker.start_parent(
        study.study_name,
        {
            "study.n_trials": cfg.study.n_trials,
            "study.sampler": cfg.study.sampler,
            "search_space": ", ".join(space.keys),
            "deploy.backends": ", ".join(backends),
            **({"deploy.left_out": _described(left_out)} if left_out else {}),
            "study.max_accuracy_drop": constraints.max_accuracy_drop,
            "study.latency_budget_ms": constraints.latency_budget_ms,
            **protocol_record,
            **({} if peak is None else peak.record(prefix="machine_peak.")),
        },
        masked_yaml(cfg),
    )

    def record_front(study: optuna.Study) -> None:
        trials = study.get_trials(deepcopy=False)
        points, baseline, split = front_of(trials, study.user_attrs, constraints)
        started = min((t.datetime_start for t in trials if t.datetime_start), default=None)
        progress = convergence(study, cfg.study.hypervolume_reference, points, started)
        note = front_note(study.study_name, points, progress, protocol_record, baseline)
        note += f"\n\n{split.note()}" if split.note() else ""
        tracker.publish_front(parent_id, study.study_name, points, note)
        if progress is not None:
            # Stepped by the configurations whose points are in: other workers' running ones
            # are not yet.
            finished = budget.trained([t for t in trials if t.state.is_finished()])
            tracker.log_metrics(parent_id, progress.metrics(), step=finished)
            # The same curve against wall-clock seconds of search: front quality over time.
            tracker.log_metrics(
                parent_id,
                {"hypervolume_by_second": progress.hypervolume},
                step=int(progress.search_seconds),
            )

    def publish(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        record_front(study)
        trials = study.get_trials(deepcopy=False)
        # Running trials of every worker count, so the last ones stop without asking for more.
        if budget.trained(trials) >= n_trials:
            study.stop()
        # An interrupt that waited for this trial's records stops the study here.
        raise_if_interrupted()

    train_data = modality.encode(splits.train.items, splits.train.labels)
    study_id = storage.get_study_id_from_name(study.study_name)
    with tempfile.TemporaryDirectory(prefix="tuner-inputs-") as inputs_dir:
        # Saved once: every logged model ships the input pipeline (tokenizer, or image
        # normalisation) beside its backend artifact.
        modality.save(Path(inputs_dir))
        context = TrialContext(
            cfg=cfg,
            space=space,
            backends=backends,
            constraints=constraints,
            train_data=train_data,
            calibration=calibration_inputs(train_data, int(cfg.deploy.calibration_samples)),
            val_data=modality.encode(splits.val.items, splits.val.labels),
            example=example,
            protocol=protocol,
            protocol_record=protocol_record,
            factory=factory,
            tracker=tracker,
            parent_run_id=parent_id,
            n_trials=n_trials,
            storage=storage,
            study_id=study_id,
            leases=leases,
            max_retry=int(cfg.study.heartbeat.max_retry),
            pruning=PruningSettings.from_config(cfg.study.pruning),
            serving=ServingContext(
                modality=modality,
                inputs_dir=Path(inputs_dir),
                label_names=list(splits.label_names),
                example_items=splits.val.items[:2],
                overrides=tuple(overrides),
                study_name=str(raw_cfg.study.name),
                profile_keys=frozenset(debug_profile_keys(raw_cfg)),
            ),
            teachers=teachers,
            peak=peak,
        )
        objective = Objective(context)
        try:
            with interruptible():
                if not finished:
                    ensure_trained(
                        study,
                        leases,
                        teachers,
                        claimed_trial_runner(study, objective, record_front),
                        poll_seconds=int(cfg.study.heartbeat.interval),
                        max_retry=int(cfg.study.heartbeat.max_retry),
                    )
                    run_to_budget(
                        study,
                        objective,
                        publish,
                        n_trials,
                        int(cfg.study.heartbeat.interval),
                        lambda: requeue_orphans(leases, storage, study_id, context.max_retry),
                    )
                rebuilder = Rebuilder(cfg, factory, example, context.calibration, protocol_record)
                moved = _confirm_front(
                    study, leases, rebuilder, protocol, constraints, record_front, tracker
                )
                # A run that trained nothing has published no front yet.
                if finished and not moved:
                    record_front(study)
        except KeyboardInterrupt:
            tracker.kill(parent_id)
            raise
        except BaseException:
            tracker.fail(parent_id, "the study stopped on an error; see the terminal")
            raise
    tracker.finish(parent_id)
    points = summarise_front(study, constraints)
    messages.review_hint(
        str(cfg.tracking.uri), tracker.experiment_id, parent_id, objective_name(protocol.statistic)
    )
    return points


def protocol_record_of(
    cfg: DictConfig, protocol: LatencyProtocol, example: ExampleInputs
) -> dict[str, Any]:
    """The latency protocol, the machine (and GPU) it runs on and the timed input's shape, as
    logged on every run and made part of every latency key."""
    return {
        **protocol.record(prefix="latency."),
        **gpu_record(str(cfg.deploy.device), prefix="latency."),
        "latency.input_shape": example.shape(),
    }


def _confirm_front(
    study: optuna.Study,
    leases: Leases,
    rebuilder: Rebuilder,
    protocol: LatencyProtocol,
    constraints: Constraints,
    record_front: Callable[[optuna.Study], None],
    tracker: Tracker,
) -> bool:
    """The end of a run: the front's latencies confirmed (`tuner.study.confirmation`), the front
    published again if they changed (returns whether they did), and every point's run brought to the
    table. The trials are all recorded by now, so a failure here is said and leaves the
    latencies as they were."""
    confirmations = []
    try:
        # One worker at a time: workers ending together would time the front under each
        # other's load, and each add a session.
        with immediate(), leases.hold("front"):
            confirmations = confirm_front(study, rebuilder, protocol, constraints)
        if confirmations:
            record_front(study)
        _revise_point_latencies(tracker, study)
    except Exception as exc:
        messages.front_not_confirmed(f"{type(exc).__name__}: {exc}")
    return bool(confirmations)


def _revise_point_latencies(tracker: Tracker, study: optuna.Study) -> None:
    """Bring every point's MLflow latency metrics to its key's latency as the table now holds
    it (with the rounds later trials and the front's confirmation added)."""
    table = LatencyTable.of_attrs(study.user_attrs)
    latencies = {
        trial.number: latency
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        for latency in [table.result(trial.user_attrs.get(LATENCY_KEY_ATTR))]
        if latency is not None
    }
    tracker.revise_latencies(study.study_name, latencies)


def _settle_settings(study: optuna.Study, cfg: DictConfig) -> None:
    given = settings_of(cfg)
    changed = settle(study, given, [str(key) for key in cfg.study.change_settings])
    # Named once the settings hold: a resume refused for another statistic renames nothing.
    study.set_metric_names(list(given["objectives"]))
    if any(key.startswith("study.hypervolume_reference") for key in changed):
        # A curve is only comparable against one reference: it starts again from the new one.
        study.set_user_attr(REFERENCE_ATTR, None)


def machine_peak(
    study: optuna.Study, protocol_record: Mapping[str, Any], threads: int
) -> MachinePeak | None:
    """This machine's peaks for the points' rooflines (`tuner.insight.roofline`); None, said
    once, where they cannot be measured: the points go on without their roofline."""
    try:
        return study_peak(study, protocol_record, threads)
    except Exception as exc:
        console.console.print(
            f"[yellow]The machine's peaks could not be measured ({type(exc).__name__}: {exc}); "
            "points are recorded without their roofline.[/]"
        )
        return None


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


def check_backends(
    backends: Sequence[str], modality: str, deploy_device: str, sources: Mapping[str, str]
) -> None:
    """Each listed backend deploys the modality's models, on the kind of device the study
    deploys on (`deploy.device`, which must exist here)."""
    device = resolve_device(deploy_device, DEPLOY_DEVICE_KEY)
    for name in backends:
        backend = BACKENDS.get(name)
        if modality not in backend.modalities:
            raise ConfigError(
                f"Invalid config: key 'deploy.backend': '{name}' deploys "
                f"{' and '.join(sorted(backend.modalities))} models, not {modality} ones"
                + defined_in(BACKEND_KEY, sources)
            )
        if backend.device != device.type:
            raise ConfigError(
                f"Invalid config: key 'deploy.backend': '{name}' deploys on {backend.device}, "
                f"but this study deploys on {device.type} ({DEPLOY_DEVICE_KEY}={deploy_device})"
                + defined_in(BACKEND_KEY, sources)
            )


def runnable_backends(
    backends: Sequence[str], sources: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The listed backends this machine can run, and why each other one cannot (one console
    line each). None runnable stops the study before anything is created."""
    notice = unknown_cpu_notice()
    if notice:
        messages.unknown_cpu(notice)
    left_out = unavailable_backends(backends)
    for name, reason in left_out.items():
        messages.backend_left_out(name, reason)
    runnable = [name for name in backends if name not in left_out]
    if not runnable:
        raise ConfigError(
            f"Invalid config: key 'deploy.backend': no listed backend runs on this machine "
            f"({_described(left_out)})" + defined_in(BACKEND_KEY, sources)
        )
    return runnable, left_out


def _described(reasons: Mapping[str, str]) -> str:
    return "; ".join(f"{name}: {reason}" for name, reason in reasons.items())


def _deploy_only_on(space: SearchSpace, backends: Sequence[str]) -> SearchSpace:
    """The search space with `deploy.backend` listing the runnable backends only: the
    distribution the backend param of every point is recorded under."""
    if not isinstance(space.distributions.get(BACKEND_KEY), CategoricalDistribution):
        return space
    narrowed = CategoricalDistribution(list(backends))
    return replace(space, distributions={**space.distributions, BACKEND_KEY: narrowed})


def check_same_space(
    study: optuna.Study,
    space: SearchSpace,
    sources: Mapping[str, str],
    left_out: Mapping[str, str],
) -> None:
    """A resumed study samples every key as its earlier trials did: Optuna refuses other
    choices of a categorical key (or another kind of range) trial by trial, so that is
    refused here, once, before any training."""
    recorded: dict[str, optuna.distributions.BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            recorded.setdefault(name, distribution)
    # A key the study searched that this run neither searches nor fixes (a renamed key, or a
    # search-space file left out) would mix two kinds of trials in one front.
    missing = sorted(set(recorded) - set(space.distributions) - set(space.fixed))
    if missing:
        raise ConfigError(
            f"Invalid config: key '{missing[0]}': study '{study.study_name}' searched "
            f"{', '.join(missing)}, which this run neither searches nor fixes; keep the "
            "study's search space, fix the key on the command line, or start another study.name"
        )
    for name, distribution in space.distributions.items():
        if name not in recorded:
            continue
        try:
            check_distribution_compatibility(recorded[name], distribution)
        except ValueError:
            hint = "; keep the study's search space, or start another study.name"
            verb, again = "samples it from", "would from"
            if name == BACKEND_KEY:
                verb, again = "deploys on", "would on"
                # The backends of a study are those the machine that started it could run.
                hint = (
                    (f" ({_described(left_out)})" if left_out else "")
                    + "; resume it on a machine that runs the same backends, or start another "
                    "study.name"
                )
            raise ConfigError(
                f"Invalid config: key '{name}': study '{study.study_name}' {verb} "
                f"{_shown(recorded[name])}, this run {again} {_shown(distribution)}{hint}"
                + defined_in(name, sources)
            ) from None


def _shown(distribution: optuna.distributions.BaseDistribution) -> str:
    if isinstance(distribution, CategoricalDistribution):
        return f"choice({', '.join(str(choice) for choice in distribution.choices)})"
    return repr(distribution)


_CALIBRATION_BATCH = 32


def calibration_inputs(train_data: Encoded, samples: int) -> list[tuple[torch.Tensor, ...]]:
    """The first training batches (in order, so every backend and trial sees the same), for
    backends that calibrate activation ranges."""
    batches = train_data.batches(_CALIBRATION_BATCH)
    return [batch.inputs for batch in itertools.islice(batches, -(-samples // _CALIBRATION_BATCH))]

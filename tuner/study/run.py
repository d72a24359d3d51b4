"""A study from start to end, in one read: prepared and opened (`preparation`), this worker's
trials run until the study holds its budget of trained configurations, and the run finished
(`finishing`: the front confirmed, summarised, and how to review it)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig

from tuner import console
from tuner.config import debug_profile_keys
from tuner.data import Encoded
from tuner.front import Point, PruningSettings
from tuner.insight import MachinePeak
from tuner.interrupts import interruptible, raise_if_interrupted
from tuner.store import budget, record_machine
from tuner.study import messages
from tuner.study.confirmation import Rebuilder, front_unconfirmed
from tuner.study.finishing import finish_front, summarised
from tuner.study.parent_run import front_recorder, machine_peak, start_parent_run
from tuner.study.preparation import Ready, calibration_inputs, protocol_record_of, ready_study
from tuner.study.stale_trials import requeue_orphans
from tuner.study.teacher_trial import ensure_trained
from tuner.study.worker_loop import Publish, claimed_trial_runner, nothing_left, run_to_budget
from tuner.trial import Objective, ServingContext, TrialContext

RecordFront = Callable[[optuna.Study], None]


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
    with ExitStack() as lifetime:
        return _run(ready_study(raw_cfg, sources or {}, overrides, lifetime), raw_cfg, overrides)


def _run(ready: Ready, raw_cfg: DictConfig, overrides: Sequence[str]) -> list[Point]:
    """`run_study` on the study `ready` opened."""
    cfg, study, tracker, protocol = ready.cfg, ready.study, ready.tracker, ready.data.protocol
    n_trials = int(cfg.study.n_trials)
    finished = nothing_left(study, n_trials)
    protocol_record = protocol_record_of(cfg, protocol, ready.data.example)
    study_id = ready.storage.get_study_id_from_name(study.study_name)
    messages.machine(record_machine(ready.storage, study_id, protocol_record))
    # A finished study's run goes on only to confirm a front still short of sessions that it
    # can time here (one that met a long slow spell, or that a higher front_sessions asks
    # more of).
    if finished and not front_unconfirmed(
        study, ready.constraints, protocol.front_sessions, cfg.deploy, protocol_record
    ):
        messages.budget_reached(study.study_name, n_trials)
        return summarised(study, ready.constraints, cfg, tracker, None, protocol)
    if finished:
        messages.confirming_finished_front(study.study_name, n_trials)
    peak = machine_peak(study, protocol_record, protocol.num_threads)
    parent_id = start_parent_run(ready, protocol_record, peak)
    record_front = front_recorder(
        tracker, parent_id, ready.constraints, cfg.study.hypervolume_reference, protocol_record
    )
    modality, splits = ready.data.modality, ready.data.splits
    train_data = modality.encode(splits.train.items, splits.train.labels)
    with tempfile.TemporaryDirectory(prefix="tuner-inputs-") as inputs_dir:
        # Saved once: every logged model ships the input pipeline (tokenizer, or image
        # normalisation) beside its backend artifact.
        modality.save(Path(inputs_dir))
        context = _trial_context(
            ready,
            raw_cfg,
            overrides,
            Path(inputs_dir),
            train_data=train_data,
            protocol_record=protocol_record,
            parent_id=parent_id,
            study_id=study_id,
            peak=peak,
        )
        _run_trials(study, context, finished, record_front)
    tracker.finish(parent_id)
    return summarised(study, ready.constraints, cfg, tracker, parent_id, protocol)


def _trial_context(
    ready: Ready,
    raw_cfg: DictConfig,
    overrides: Sequence[str],
    inputs_dir: Path,
    *,
    train_data: Encoded,
    protocol_record: dict[str, Any],
    parent_id: str,
    study_id: int,
    peak: MachinePeak | None,
) -> TrialContext:
    """Everything this worker's trials share; a logged model ships the input pipeline saved in
    `inputs_dir`, and its retraining command starts with `overrides`."""
    cfg, data = ready.cfg, ready.data
    return TrialContext(
        cfg=cfg,
        space=ready.space,
        backends=ready.backends,
        constraints=ready.constraints,
        train_data=train_data,
        calibration=calibration_inputs(train_data, int(cfg.deploy.calibration_samples)),
        val_data=data.modality.encode(data.splits.val.items, data.splits.val.labels),
        example=data.example,
        protocol=data.protocol,
        protocol_record=protocol_record,
        factory=data.factory,
        tracker=ready.tracker,
        parent_run_id=parent_id,
        n_trials=int(cfg.study.n_trials),
        storage=ready.storage,
        study_id=study_id,
        leases=ready.leases,
        max_retry=int(cfg.study.heartbeat.max_retry),
        pruning=PruningSettings.from_config(cfg.study.pruning),
        serving=ServingContext(
            modality=data.modality,
            inputs_dir=inputs_dir,
            label_names=list(data.splits.label_names),
            example_items=data.splits.val.items[:2],
            overrides=tuple(overrides),
            study_name=str(raw_cfg.study.name),
            profile_keys=frozenset(debug_profile_keys(raw_cfg)),
        ),
        teachers=ready.teachers,
        peak=peak,
    )


def _run_trials(
    study: optuna.Study, context: TrialContext, finished: bool, record_front: RecordFront
) -> None:
    """This worker's trials until the budget is reached (none where the study had finished),
    then the front's confirmation. The parent run is killed by an interrupt and failed by an
    error, which go on up."""
    objective = Objective(context)
    leases, tracker, parent_id = context.leases, context.tracker, context.parent_run_id
    try:
        with interruptible():
            if not finished:
                ensure_trained(
                    study,
                    leases,
                    context.teachers,
                    claimed_trial_runner(study, objective, record_front),
                    poll_seconds=int(context.cfg.study.heartbeat.interval),
                    max_retry=context.max_retry,
                )
                run_to_budget(
                    study,
                    objective,
                    _publisher(record_front, context.n_trials, objective),
                    context.n_trials,
                    int(context.cfg.study.heartbeat.interval),
                    lambda: requeue_orphans(
                        leases, context.storage, context.study_id, context.max_retry
                    ),
                )
            rebuilder = Rebuilder(
                context.cfg,
                context.factory,
                context.example,
                context.calibration,
                context.protocol_record,
            )
            moved = finish_front(
                study,
                leases,
                rebuilder,
                context.protocol,
                context.constraints,
                record_front,
                tracker,
                confirm=context.target_machine is None,
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


def _publisher(record_front: RecordFront, n_trials: int, objective: Objective) -> Publish:
    """What runs after each of this worker's trials: the front published, the study stopped at
    its budget or by what its trial raised to stop it (`Objective.stopped`), and an interrupt
    that waited for the trial's records raised."""

    def publish(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        record_front(study)
        if objective.stopped is not None:
            raise objective.stopped
        trials = study.get_trials(deepcopy=False)
        # Running trials of every worker count, so the last ones stop without asking for more.
        if budget.trained(trials) >= n_trials:
            study.stop()
        # An interrupt that waited for this trial's records stops the study here.
        raise_if_interrupted()

    return publish

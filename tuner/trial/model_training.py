"""A trial's model trained once: the model it starts from (its configuration's own, a student cut
from the study's teacher, or the stored teacher a retry of the teacher trial loads), its training
(distilled from the teacher, stopped early when it cannot reach the front), and what every
backend's point of it shares (`Trained`). The teacher trial stores its teacher here, before any
backend is tried."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import optuna
from omegaconf import DictConfig
from torch import nn

from tuner import console
from tuner.deploy import Reference
from tuner.front import Baseline, NotWorthTraining, baseline_of, points_of, stop_reason
from tuner.interrupts import raise_if_interrupted
from tuner.keys import CURVE_ATTR, EAGER_ACCURACY_ATTR, START_FROM_TAG, TEACHER_TAG
from tuner.latency import flops_per_call
from tuner.models import ModelRecipe
from tuner.store import digest_of
from tuner.training import (
    Distillation,
    EpochResult,
    TrainResult,
    batch_loss,
    train,
    validation_logits,
)
from tuner.trial import latency as trial_latency
from tuner.trial import messages
from tuner.trial.context import TrialContext
from tuner.trial.latency import LatencyKeys
from tuner.trial.model_factory import untrained_model
from tuner.trial.points import Trained
from tuner.trial.students import starts_from_teacher
from tuner.trial.teacher import KEY as TEACHER_KEY
from tuner.trial.teacher import (
    START_KEY,
    TEMPERATURE_KEY,
    TeacherMissing,
    TrainedTeacher,
    record_stored,
    store_after_training,
)


def stored_teacher_to_load(ctx: TrialContext) -> TrainedTeacher | None:
    """A retry of the teacher trial whose teacher is stored already (its worker died after
    storing it, before its points were written) loads it rather than train another, so
    that every student of the study learns from the same one. None: train it (not stored,
    or stored by an earlier version of tuner, whose record cannot show how it trained)."""
    assert ctx.teachers is not None
    stored = ctx.teachers.trained(ctx.storage.get_study_user_attrs(ctx.study_id))
    return None if stored is None or stored.training is None else stored


def starting_model(
    ctx: TrialContext, cfg: DictConfig, stored: TrainedTeacher | None
) -> tuple[nn.Module, TrainedTeacher | None]:
    """The model the trial trains, with the stored teacher it is when `stored` loaded (its
    training is then replayed, not run); else the configuration's model, untrained, and None."""
    loaded = None if stored is None else _loaded(ctx, stored)
    if loaded is None:
        return _untrained(ctx, cfg), None
    return loaded, stored


def _loaded(ctx: TrialContext, stored: TrainedTeacher) -> nn.Module | None:
    """A copy of the stored teacher (deployment must not touch the one students learn
    from); None when its files are confirmed gone: it is trained again. One that cannot be
    fetched fails the trial, with the reason."""
    assert ctx.teachers is not None
    try:
        teacher = ctx.teachers.model_at(stored.location)
    except TeacherMissing as exc:
        messages.teacher_missing(stored.location, str(exc))
        return None
    messages.teacher_loaded(stored.trial, stored.location)
    return copy.deepcopy(teacher)


def _untrained(ctx: TrialContext, cfg: DictConfig) -> nn.Module:
    """The configuration's model, edited and initialised, before any training: from the
    model's own weights, or from the study's teacher cut to its size."""
    teacher = None
    if ctx.teachers is not None and starts_from_teacher(cfg.train):
        teacher = ctx.teachers.model(ctx.storage.get_study_user_attrs(ctx.study_id))
    # Edits that measure what to keep (attention heads) measure it on the calibration batches,
    # the first training batches, the same for every trial.
    return untrained_model(
        cfg,
        lambda: ctx.factory.build(cfg.model, int(cfg.train.seed)),
        teacher,
        ctx.calibration,
    )


def train_once(
    ctx: TrialContext,
    model: nn.Module,
    cfg: DictConfig,
    params: dict[str, Any],
    architecture: dict[str, Any],
    run_id: str,
    trial: optuna.Trial,
    configuration: int,
    keys: LatencyKeys,
    teacher_for: str | None = None,
    stored_teacher: TrainedTeacher | None = None,
) -> Trained:
    """`model` trained (or, for the `stored_teacher` it is, its training replayed), with what
    every backend's point of it shares. `teacher_for`: the reference of the study's teacher
    that the trial trains, stored once trained."""
    distillation, teacher_pins = _distillation(ctx, cfg, run_id)
    if stored_teacher is not None:
        result = _replay_training(ctx, model, stored_teacher, cfg, trial, run_id)
    else:
        on_epoch = _end_of_epoch(ctx, cfg, trial, run_id, keys, teacher_for)
        result = _trained_here(ctx, model, cfg, distillation, on_epoch)
    reference = Reference(result.val_logits, ctx.val_data.labels)
    trial.set_user_attr(EAGER_ACCURACY_ATTR, reference.accuracy)
    flops = _flops(ctx, model, run_id)
    if teacher_for is not None and stored_teacher is None:
        # Stored before deployment: students need it whatever its backends do.
        uri = store_after_training(
            model,
            ModelRecipe.of(cfg.model, ctx.factory.num_labels),
            ctx.serving.label_names,
            lambda directory: ctx.tracker.log_directory(run_id, directory),
        )
        record_stored(ctx.storage, ctx.study_id, teacher_for, trial.number, uri, result)
    # Read once per trained model: every backend's point is judged against the same one.
    baseline = baseline_of(ctx.split_trials(), Baseline(reference.accuracy, trial.number))
    return Trained(
        model,
        params,
        architecture,
        result,
        reference,
        configuration,
        trial.number,
        baseline,
        {backend: key and digest_of(key) for backend, key in keys.items()},
        teacher_pins,
        teacher_for,
        flops,
        None
        if stored_teacher is None
        else f"{stored_teacher.location} (trained in trial #{stored_teacher.trial})",
    )


def _distillation(
    ctx: TrialContext, cfg: DictConfig, run_id: str
) -> tuple[Distillation | None, dict[str, Any]]:
    """What the trial learns from the study's teacher, with the teacher's pins; neither for a
    trial that learns from none (alpha 0)."""
    if ctx.teachers is None or not float(cfg.train.distill.alpha) > 0:
        return None, {}
    attrs = ctx.storage.get_study_user_attrs(ctx.study_id)
    start_from = str(cfg.train.distill.start_from)
    # What a distilled point learnt from, pinned in its retraining command so that it
    # retrains alike after an experiment's defaults change.
    teacher_pins = {
        TEACHER_KEY: ctx.teachers.location(attrs),
        START_KEY: start_from,
        TEMPERATURE_KEY: float(cfg.train.distill.temperature),
    }
    distillation = ctx.teachers.distillation(cfg.train, ctx.train_data, attrs)
    ctx.tracker.set_tags(
        run_id,
        {TEACHER_TAG: str(teacher_pins[TEACHER_KEY]), START_FROM_TAG: start_from},
    )
    return distillation, teacher_pins


def _end_of_epoch(
    ctx: TrialContext,
    cfg: DictConfig,
    trial: optuna.Trial,
    run_id: str,
    keys: LatencyKeys,
    teacher_for: str | None,
) -> Callable[[EpochResult], None]:
    """What follows each epoch: its metrics logged, the curve kept on the trial, and, with
    early stopping, a trial that cannot reach the front stopped (never the teacher's: students
    need it)."""
    curve: list[float] = []

    def end_of_epoch(epoch: EpochResult) -> None:
        metrics = {"train_loss": epoch.train_loss, "val_accuracy": epoch.val_accuracy}
        ctx.tracker.log_metrics(run_id, metrics, step=epoch.epoch)
        curve.append(epoch.val_accuracy)
        trial.set_user_attr(CURVE_ATTR, curve)
        if ctx.pruning.enabled and teacher_for is None:
            trials, table = ctx.split_trials(), ctx.latency_table()
            # The latencies as the table stands now, as the front's points have them.
            latencies = trial_latency.from_table(table, keys)
            reason = stop_reason(
                epoch.val_accuracy,
                epoch.epoch,
                int(cfg.train.epochs),
                {
                    b: None if r is None else r.ranked_ms(ctx.protocol.statistic)
                    for b, r in latencies.items()
                },
                trials,
                points_of(trials, ctx.constraints, table),
                ctx.constraints,
                ctx.pruning,
            )
            if reason:
                raise NotWorthTraining(
                    reason,
                    epoch.val_accuracy,
                    trial_latency.fastest(latencies, ctx.protocol.statistic),
                )

    return end_of_epoch


def _trained_here(
    ctx: TrialContext,
    model: nn.Module,
    cfg: DictConfig,
    distillation: Distillation | None,
    on_epoch: Callable[[EpochResult], None],
) -> TrainResult:
    """The training loop run on `model`, its steps shown as they go; each step is a point at
    which an interrupt stops it."""
    with console.training_progress() as progress:
        task = progress.add_task("training", total=None, loss=math.nan)

        def step_done(done: int, total: int, loss: float) -> None:
            raise_if_interrupted()
            progress.update(task, completed=done, total=total, loss=loss)

        return train(
            model,
            ctx.train_data,
            ctx.val_data,
            cfg.train,
            batch_loss(ctx.serving.modality.name, cfg.train, ctx.factory.num_labels),
            on_step=step_done,
            on_epoch=on_epoch,
            distillation=distillation,
        )


def _replay_training(
    ctx: TrialContext,
    model: nn.Module,
    stored: TrainedTeacher,
    cfg: DictConfig,
    trial: optuna.Trial,
    run_id: str,
) -> TrainResult:
    """A loaded teacher's training as its stored record has it, its validation logits
    computed again; shown in the trial's run and curve as if it had trained here."""
    assert stored.training is not None
    result = copy.copy(stored.training)
    result.val_logits = validation_logits(model, ctx.val_data, cfg.train)
    ctx.tracker.replay_epochs(run_id, result.epochs)
    trial.set_user_attr(CURVE_ATTR, [epoch.val_accuracy for epoch in result.epochs])
    return result


def _flops(ctx: TrialContext, model: nn.Module, run_id: str) -> float | None:
    """FLOPs of one call; None, with the reason tagged on the run, when the counter fails."""
    try:
        return flops_per_call(model, ctx.example.tensors)
    except Exception as exc:  # the points go on without their roofline
        ctx.tracker.set_tags(run_id, {"roofline.absent": f"{type(exc).__name__}: {exc}"})
        return None

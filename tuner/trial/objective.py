"""One trial: sample, build, edit, initialise, train once, then deploy on every backend.

Every listed backend is deployed; none is sampled. The trial carries its configuration's
representative point (`tuner.trial.points.representative`: the one that dominates the most
area against the study's hypervolume reference), which is what the sampler learns from; each
other backend becomes a point of its own, an Optuna trial added to the study with the same
training params and that backend, so the front and MLflow see one point per (trained config,
backend) while the model is trained only once. A backend that fails is a failed point; the
trial fails only when no backend deployed the model.
"""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState
from torch import nn

from tuner import console
from tuner.config import fits, with_params
from tuner.deploy import BackendFailed, BackendResult, Reference, deploy_on
from tuner.front import (
    CURVE_ATTR,
    EAGER_ACCURACY_ATTR,
    PRUNED_ATTR,
    SAMPLER_VIEW_ATTR,
    Baseline,
    NotWorthTraining,
    baseline_of,
    over_budget_reason,
    points_of,
    stop_reason,
)
from tuner.interrupts import deferred, immediate, raise_if_interrupted
from tuner.latency import flops_per_call
from tuner.models import ModelRecipe
from tuner.store import (
    BACKEND_KEY,
    FAIL_REASON_ATTR,
    RUN_ID_ATTR,
    TEACHER_OF_ATTR,
    TRAINED_IN_ATTR,
    budget,
    digest_of,
    requeue,
    structure_of,
    trial_id_of,
)
from tuner.training import EpochResult, TrainResult, batch_loss, train, validation_logits
from tuner.trial import latency as trial_latency
from tuner.trial import messages
from tuner.trial import points as trial_points
from tuner.trial.context import TrialContext
from tuner.trial.latency import LatencyKeys
from tuner.trial.model_factory import untrained_model
from tuner.trial.points import ARCHITECTURE_ATTR, CONFIGURATION_ATTR, Trained
from tuner.trial.teacher import KEY as TEACHER_KEY
from tuner.trial.teacher import (
    START_KEY,
    TEMPERATURE_KEY,
    TeacherMissing,
    TrainedTeacher,
    record_stored,
    starts_from_teacher,
    store_after_training,
    teacher_of,
)

_SUGGEST = {
    FloatDistribution: lambda trial, name, d: trial.suggest_float(
        name, d.low, d.high, step=d.step, log=d.log
    ),
    IntDistribution: lambda trial, name, d: trial.suggest_int(
        name, d.low, d.high, step=d.step, log=d.log
    ),
    CategoricalDistribution: lambda trial, name, d: trial.suggest_categorical(name, d.choices),
}


def suggest(trial: optuna.Trial, space: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    return {name: _SUGGEST[type(d)](trial, name, d) for name, d in space.items()}


class Objective:
    """Optuna's objective: returns (val_accuracy, latency) of the trial's own point, its latency
    by the study's statistic (`latency_ms_p50` by default)."""

    def __init__(self, context: TrialContext) -> None:
        self.context = context

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        ctx = self.context
        done = budget.trained(ctx.study_trials(), before=trial.number)
        if done >= ctx.n_trials:
            # Another worker took the last configuration between this one's check and its ask.
            trial.set_user_attr(budget.SKIPPED_ATTR, f"study.n_trials={ctx.n_trials} reached")
            trial.study.stop()
            raise optuna.TrialPruned(f"study.n_trials={ctx.n_trials} already reached")
        # Set first, so that other workers count this trial from now on.
        trial.set_user_attr(TRAINED_IN_ATTR, trial.number)
        configuration = budget.configuration_of(ctx.storage.get_trial(trial_id_of(trial)))
        trial.set_user_attr(CONFIGURATION_ATTR, configuration)
        try:
            return self._run(trial, done + 1, configuration)
        except KeyboardInterrupt:
            with deferred():
                self._interrupted(trial)
            raise

    def _run(self, trial: optuna.Trial, index: int, configuration: int) -> tuple[float, float]:
        ctx = self.context
        # An interrupt that waited while Optuna created this trial stops it before any run.
        raise_if_interrupted()
        trials = ctx.study_trials()
        teacher = teacher_of(
            ctx.storage.get_trial(trial_id_of(trial)), {t.number: t for t in trials}
        )
        if teacher is None:
            sampled = {k: d for k, d in ctx.space.distributions.items() if k != BACKEND_KEY}
            params = suggest(trial, sampled)
        else:
            # The study's teacher trains with fixed values, which no sampler draws; those that
            # lie in the searched ranges are its params, as for each of its points.
            params = dict(teacher["params"])
            trial.set_user_attr(TEACHER_OF_ATTR, teacher["reference"])
            for name, value in params.items():
                distribution = ctx.space.distributions.get(name)
                if distribution is not None and fits(distribution, value):
                    internal = distribution.to_internal_repr(value)
                    ctx.storage.set_trial_param(trial_id_of(trial), name, internal, distribution)
        cfg = with_params(ctx.cfg, params)
        # For a teacher trial whose teacher is stored already: its record, to load it by.
        stored_teacher = None if teacher is None else self._stored_teacher(trial)
        messages.trial_header(index, ctx.n_trials, trial.number, params)
        # What relative edits (fractions of the loaded model) stand for, recorded beside them.
        architecture = ctx.factory.architecture(cfg.model, int(cfg.train.seed))
        run_id = ctx.tracker.start_trial(
            ctx.parent_run_id,
            str(cfg.study.name),
            trial.number,
            None,
            ctx.logged_params({**params, **architecture}),
            trained_in_trial=trial.number,
        )
        trial.set_user_attr(RUN_ID_ATTR, run_id)
        trial.set_user_attr(ARCHITECTURE_ATTR, architecture)
        # A retry of this configuration (after an interrupt or a dead worker) deploys only on
        # the backends that have no point of it yet.
        recorded = self._recorded_backends(configuration, trial.number)
        backends = [b for b in ctx.backends if b not in recorded]
        if not backends:
            # Killed after every point was written: nothing is left to train or deploy.
            reason = f"every backend already has a point of configuration #{configuration}"
            trial.set_user_attr(FAIL_REASON_ATTR, reason)
            ctx.tracker.fail(run_id, reason)
            raise optuna.TrialPruned(reason)
        # A retry queued by an earlier version carries the backend it drew; it keeps it.
        carried = ctx.storage.get_trial(trial_id_of(trial)).params.get(BACKEND_KEY)
        # Every backend's artifact stays here until the points that join the front are logged.
        with tempfile.TemporaryDirectory(prefix="tuner-trial-") as workdir:
            try:
                # Interrupts stop training and deploying at once; the points are then written
                # whole (the caller holds interrupts back meanwhile).
                with immediate():
                    loaded = None if stored_teacher is None else self._loaded(stored_teacher)
                    model = self._untrained(cfg) if loaded is None else loaded
                    keys = trial_latency.latency_keys(
                        cfg, structure_of(model), backends, ctx.protocol_record
                    )
                    # Only a latency budget and early stopping decide anything before training
                    # ends; without them the trained artifacts are timed, converted only once.
                    # The teacher is trained whatever its latency: students need it.
                    if teacher is None and (
                        ctx.pruning.enabled or ctx.constraints.latency_budget_ms is not None
                    ):
                        latencies = trial_latency.before_training(
                            ctx, model, cfg, keys, Path(workdir) / "untrained"
                        )
                        budget_ms = ctx.constraints.latency_budget_ms
                        over_budget = over_budget_reason(
                            latencies, budget_ms, ctx.protocol.statistic
                        )
                        if over_budget:
                            raise NotWorthTraining(
                                over_budget,
                                0.0,
                                trial_latency.fastest(latencies, ctx.protocol.statistic),
                            )
                    trained = self._train(
                        model,
                        cfg,
                        params,
                        architecture,
                        run_id,
                        trial,
                        configuration,
                        keys,
                        teacher_for=None if teacher is None else str(teacher["reference"]),
                        stored_teacher=None if loaded is None else stored_teacher,
                    )
                    results = self._deploy_everywhere(trained, backends, cfg, Path(workdir), keys)
                own_backend = (
                    carried
                    if carried in results
                    else trial_points.representative(ctx, results, trained)
                )
                on_front = trial_points.joining_front(ctx, results, trained)
                for backend, result in results.items():
                    if backend != own_backend:
                        trial_points.add_point(ctx, trained, result, backend in on_front)
                if own_backend is None:
                    raise BackendFailed(
                        "no backend deployed the model: "
                        + "; ".join(f"{b}: {r.error}" for b, r in results.items())
                    )
                self._own_backend(trial, run_id, own_backend, as_param=carried is None)
                own = results[own_backend]
                constraints = trial_points.record(
                    ctx, trial.set_user_attr, run_id, trained, own, own_backend in on_front
                )
                for name, value in constraints.items():
                    trial.set_constraint(name, value)
            except NotWorthTraining as pruned:
                self._pruned(trial, run_id, pruned)
                raise
            except Exception as exc:
                self._fail(trial, run_id, exc)
                raise
        if own.error:
            # Only a carried backend can be one that failed: a failed point, recorded above.
            raise BackendFailed(f"backend {own_backend}: {own.error}")
        ctx.tracker.finish(run_id)
        return own.val_accuracy, own.metrics()[ctx.objective]

    def _own_backend(self, trial: optuna.Trial, run_id: str, backend: str, as_param: bool) -> None:
        """Record on the trial (and its MLflow run) the backend of the point it carries."""
        ctx = self.context
        distribution = ctx.space.distributions.get(BACKEND_KEY)
        if as_param and isinstance(distribution, CategoricalDistribution):
            # A param, as for every point, though no sampler drew it.
            internal = distribution.to_internal_repr(backend)
            ctx.storage.set_trial_param(trial_id_of(trial), BACKEND_KEY, internal, distribution)
        trial.set_user_attr(BACKEND_KEY, backend)
        ctx.tracker.set_backend(run_id, trial.number, backend)

    def _recorded_backends(self, configuration: int, number: int) -> set[str]:
        """Backends that already have a point (complete or failed) of `configuration`, made
        by an earlier attempt at it."""
        return {
            str(t.user_attrs.get(BACKEND_KEY))
            for t in self.context.study_trials()
            if t.number != number
            and t.user_attrs.get(CONFIGURATION_ATTR) == configuration
            and t.user_attrs.get(TRAINED_IN_ATTR) != t.number
            and t.state in (TrialState.COMPLETE, TrialState.FAIL)
        }

    def _untrained(self, cfg: DictConfig) -> nn.Module:
        """The configuration's model, edited and initialised, before any training: from the
        model's own weights, or from the study's teacher cut to its size."""
        ctx = self.context
        teacher = None
        if ctx.teachers is not None and starts_from_teacher(cfg.train):
            teacher = ctx.teachers.model(ctx.storage.get_study_user_attrs(ctx.study_id))
        return untrained_model(
            cfg, lambda: ctx.factory.build(cfg.model, int(cfg.train.seed)), teacher
        )

    def _train(
        self,
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
        ctx = self.context
        curve: list[float] = []
        distillation, teacher_pins = None, {}
        if ctx.teachers is not None and float(cfg.train.distill.alpha) > 0:
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
                {"tuner.teacher": str(teacher_pins[TEACHER_KEY]), "tuner.start_from": start_from},
            )

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

        def step_done(done: int, total: int, loss: float) -> None:
            raise_if_interrupted()
            progress.update(task, completed=done, total=total, loss=loss)

        if stored_teacher is not None:
            result = self._replay_training(model, stored_teacher, cfg, trial, run_id)
        else:
            with console.training_progress() as progress:
                task = progress.add_task("training", total=None, loss=math.nan)
                result = train(
                    model,
                    ctx.train_data,
                    ctx.val_data,
                    cfg.train,
                    batch_loss(ctx.serving.modality.name, cfg.train, ctx.factory.num_labels),
                    on_step=step_done,
                    on_epoch=end_of_epoch,
                    distillation=distillation,
                )
        reference = Reference(result.val_logits, ctx.val_data.labels)
        trial.set_user_attr(EAGER_ACCURACY_ATTR, reference.accuracy)
        try:
            flops = flops_per_call(model, ctx.example.tensors)
        except Exception as exc:  # the points go on without their roofline
            flops = None
            ctx.tracker.set_tags(run_id, {"roofline.absent": f"{type(exc).__name__}: {exc}"})
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

    def _stored_teacher(self, trial: optuna.Trial) -> TrainedTeacher | None:
        """A retry of the teacher trial whose teacher is stored already (its worker died after
        storing it, before its points were written) loads it rather than train another, so
        that every student of the study learns from the same one. None: train it (not stored,
        or stored by an earlier version of tuner, whose record cannot show how it trained)."""
        ctx = self.context
        assert ctx.teachers is not None
        stored = ctx.teachers.trained(ctx.storage.get_study_user_attrs(ctx.study_id))
        return None if stored is None or stored.training is None else stored

    def _loaded(self, stored: TrainedTeacher) -> nn.Module | None:
        """A copy of the stored teacher (deployment must not touch the one students learn
        from); None when its files are confirmed gone: it is trained again. One that cannot be
        fetched fails the trial, with the reason."""
        assert self.context.teachers is not None
        try:
            teacher = self.context.teachers.model_at(stored.location)
        except TeacherMissing as exc:
            messages.teacher_missing(stored.location, str(exc))
            return None
        messages.teacher_loaded(stored.trial, stored.location)
        return copy.deepcopy(teacher)

    def _replay_training(
        self,
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
        result.val_logits = validation_logits(model, self.context.val_data, cfg.train)
        self.context.tracker.replay_epochs(run_id, result.epochs)
        trial.set_user_attr(CURVE_ATTR, [epoch.val_accuracy for epoch in result.epochs])
        return result

    def _deploy_everywhere(
        self,
        trained: Trained,
        backends: Sequence[str],
        cfg: DictConfig,
        workdir: Path,
        keys: LatencyKeys,
    ) -> dict[str, BackendResult]:
        ctx = self.context
        recipe = ModelRecipe.of(cfg.model, ctx.factory.num_labels)
        results = {}
        for backend in backends:
            raise_if_interrupted()
            result = deploy_on(
                backend,
                trained.model,
                recipe,
                trained.reference,
                ctx.val_data,
                ctx.example,
                ctx.protocol,
                cfg.deploy,
                workdir,
                ctx.calibration,
                timer=lambda logits_of, key=keys[backend]: trial_latency.with_one_more_round(
                    ctx, logits_of, key
                ),
            )
            results[backend] = result
        results.update(trial_latency.first_latencies(ctx, results, keys))
        for result in results.values():
            messages.backend_result(result)
        return results

    def _interrupted(self, trial: optuna.Trial) -> None:
        """Ctrl-C or SIGTERM: close this trial's runs as KILLED and queue it again."""
        ctx = self.context
        reason = "interrupted (Ctrl-C or SIGTERM); queued again with the same params"
        ctx.tracker.close_abandoned(str(ctx.cfg.study.name), trial.number, reason, "KILLED")
        frozen = ctx.storage.get_trial(trial_id_of(trial))
        requeue(ctx.leases, ctx.storage, ctx.study_id, frozen, ctx.max_retry)

    def _pruned(self, trial: optuna.Trial, run_id: str, pruned: NotWorthTraining) -> None:
        """Not trained further: the run is closed KILLED with the reason (its epochs so far
        stay), and Optuna records the trial PRUNED; the sampler is shown it as the poor
        complete trial it stands for (`tuner.front.early_stopping.sampler_view`)."""
        reason = str(pruned)
        ctx = self.context
        view = pruned.sampler_view(ctx.constraints, baseline_of(ctx.split_trials()))
        trial.set_user_attr(SAMPLER_VIEW_ATTR, view)
        trial.set_user_attr(PRUNED_ATTR, reason)
        ctx.tracker.set_tags(run_id, {"tuner.pruned": "true"})
        ctx.tracker.close(run_id, "KILLED", reason)
        messages.trial_pruned(trial.number, reason)

    def _fail(self, trial: optuna.Trial, run_id: str, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        trial.set_user_attr(FAIL_REASON_ATTR, reason)
        self.context.tracker.fail(run_id, reason)
        messages.trial_failed(trial.number, reason, exc)

"""One trial: sample, build, edit, initialise, train once, then deploy on every backend.

Every listed backend is deployed; none is sampled. The trial carries its configuration's
representative point (`tuner.trial.points.representative`: the one that dominates the most
area against the study's hypervolume reference), which is what the sampler learns from; each
other backend becomes a point of its own, an Optuna trial added to the study with the same
training params and that backend, so the front and MLflow see one point per (trained config,
backend) while the model is trained only once. A backend that fails is a failed point; the
trial fails only when no backend deployed the model.

The training is `tuner.trial.model_training`, the deployment and its points
`tuner.trial.deployment`; this module runs them in order, and says what becomes of a trial that
is interrupted, stopped early or fails.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping
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

from tuner.config import fits, with_params
from tuner.deploy import BackendFailed
from tuner.edits import kept_heads
from tuner.errors import StudyStopped
from tuner.front import NotWorthTraining, baseline_of, over_budget_reason
from tuner.interrupts import deferred, immediate, raise_if_interrupted
from tuner.keys import (
    ARCHITECTURE_ATTR,
    BACKEND_KEY,
    CONFIGURATION_ATTR,
    FAIL_REASON_ATTR,
    KEPT_HEADS_ATTR,
    KEPT_HEADS_TAG,
    PRUNED_ATTR,
    PRUNED_TAG,
    RUN_ID_ATTR,
    SAMPLER_VIEW_ATTR,
    SKIPPED_ATTR,
    TEACHER_OF_ATTR,
    TRAINED_IN_ATTR,
)
from tuner.store import (
    budget,
    call_with_retries,
    error_line,
    is_transient,
    requeue,
    structure_of,
    trial_id_of,
)
from tuner.trial import latency as trial_latency
from tuner.trial import messages, target
from tuner.trial.context import TrialContext
from tuner.trial.deployment import deploy_everywhere, record_points
from tuner.trial.latency import LatencyKeys
from tuner.trial.model_training import starting_model, stored_teacher_to_load, train_once
from tuner.trial.teacher import teacher_of

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
        # What stops the study, raised by a trial that Optuna fails and goes on after: the
        # worker raises it once the trial is recorded (`tuner.study.run`).
        self.stopped: StudyStopped | None = None

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        ctx = self.context
        done = budget.trained(ctx.study_trials(), before=trial.number)
        if done >= ctx.n_trials:
            # Another worker took the last configuration between this one's check and its ask.
            trial.set_user_attr(SKIPPED_ATTR, f"study.n_trials={ctx.n_trials} reached")
            trial.study.stop()
            raise optuna.TrialPruned(f"study.n_trials={ctx.n_trials} already reached")
        # Set first, so that other workers count this trial from now on.
        trial.set_user_attr(TRAINED_IN_ATTR, trial.number)
        configuration = budget.configuration_of(ctx.storage.get_trial(trial_id_of(trial)))
        trial.set_user_attr(CONFIGURATION_ATTR, configuration)
        try:
            return self._run(trial, done + 1, configuration)
        except Exception as exc:
            if is_transient(exc):
                self._lost_database(trial, exc)
            if isinstance(exc, StudyStopped):
                self.stopped = exc
            raise
        except KeyboardInterrupt:
            with deferred():
                self._interrupted(trial)
            raise

    def _run(self, trial: optuna.Trial, index: int, configuration: int) -> tuple[float, float]:
        ctx = self.context
        # An interrupt that waited while Optuna created this trial stops it before any run.
        raise_if_interrupted()
        # How long the trial waits for its target machine's latencies, from its start.
        deadline = time.monotonic() + float(ctx.cfg.study.target_wait_s)
        teacher = self._teacher(trial)
        params = self._params(trial, teacher)
        cfg = with_params(ctx.cfg, params)
        # For a teacher trial whose teacher is stored already: its record, to load it by.
        stored_teacher = None if teacher is None else stored_teacher_to_load(ctx)
        messages.trial_header(index, ctx.n_trials, trial.number, params)
        # What relative edits (fractions of the loaded model) stand for, recorded beside them.
        architecture = ctx.factory.architecture(cfg.model, int(cfg.train.seed))
        run_id = self._start_run(trial, cfg, params, architecture)
        backends = self._backends_left(trial, run_id, configuration)
        # A retry queued by an earlier version carries the backend it drew; it keeps it.
        carried = ctx.storage.get_trial(trial_id_of(trial)).params.get(BACKEND_KEY)
        # Every backend's artifact stays here until the points that join the front are logged.
        with tempfile.TemporaryDirectory(prefix="tuner-trial-") as workdir:
            try:
                # Interrupts stop training and deploying at once; the points are then written
                # whole (the caller holds interrupts back meanwhile).
                with immediate():
                    # A stored teacher whose files are gone is trained again: none replayed.
                    model, stored_teacher = starting_model(ctx, cfg, stored_teacher)
                    keys = self._before_training(
                        trial, run_id, model, cfg, backends, Path(workdir), teacher, deadline
                    )
                    trained = train_once(
                        ctx,
                        model,
                        cfg,
                        params,
                        architecture,
                        run_id,
                        trial,
                        configuration,
                        keys,
                        teacher_for=None if teacher is None else str(teacher["reference"]),
                        stored_teacher=stored_teacher,
                    )
                    results = deploy_everywhere(ctx, trained, backends, cfg, Path(workdir), keys)
                own_backend, own = record_points(ctx, trial, run_id, trained, results, carried)
            except NotWorthTraining as pruned:
                self._pruned(trial, run_id, pruned)
                raise
            except Exception as exc:
                if not is_transient(exc):
                    self._fail(trial, run_id, exc)
                raise
        if own.error:
            # Only a carried backend can be one that failed: a failed point, recorded above.
            raise BackendFailed(f"backend {own_backend}: {own.error}")
        ctx.tracker.finish(run_id)
        return own.val_accuracy, own.metrics()[ctx.objective]

    def _teacher(self, trial: optuna.Trial) -> dict[str, Any] | None:
        """The record of the study's teacher that the trial trains; None for every other."""
        trials = self.context.study_trials()
        return teacher_of(
            self.context.storage.get_trial(trial_id_of(trial)), {t.number: t for t in trials}
        )

    def _params(self, trial: optuna.Trial, teacher: Mapping[str, Any] | None) -> dict[str, Any]:
        """The trial's params: sampled, or, for the study's teacher, the values it trains with."""
        ctx = self.context
        if teacher is None:
            sampled = {k: d for k, d in ctx.space.distributions.items() if k != BACKEND_KEY}
            return suggest(trial, sampled)
        # The study's teacher trains with fixed values, which no sampler draws; those that
        # lie in the searched ranges are its params, as for each of its points.
        params = dict(teacher["params"])
        trial.set_user_attr(TEACHER_OF_ATTR, teacher["reference"])
        for name, value in params.items():
            distribution = ctx.space.distributions.get(name)
            if distribution is not None and fits(distribution, value):
                internal = distribution.to_internal_repr(value)
                ctx.storage.set_trial_param(trial_id_of(trial), name, internal, distribution)
        return params

    def _start_run(
        self,
        trial: optuna.Trial,
        cfg: DictConfig,
        params: dict[str, Any],
        architecture: dict[str, Any],
    ) -> str:
        """The trial's MLflow run, started; its id and the architecture recorded on the trial."""
        ctx = self.context
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
        return run_id

    def _record_kept_heads(self, trial: optuna.Trial, run_id: str, model: nn.Module) -> None:
        """Which attention heads the model kept, where it lost any."""
        kept = kept_heads(model)
        if kept is not None:
            trial.set_user_attr(KEPT_HEADS_ATTR, kept)
            self.context.tracker.set_tags(run_id, {KEPT_HEADS_TAG: json.dumps(kept)})

    def _backends_left(self, trial: optuna.Trial, run_id: str, configuration: int) -> list[str]:
        """The backends the trial deploys on. A retry of this configuration (after an interrupt
        or a dead worker) deploys only on the backends that have no point of it yet."""
        ctx = self.context
        recorded = self._recorded_backends(configuration, trial.number)
        backends = [b for b in ctx.backends if b not in recorded]
        if not backends:
            # Killed after every point was written: nothing is left to train or deploy.
            reason = f"every backend already has a point of configuration #{configuration}"
            trial.set_user_attr(FAIL_REASON_ATTR, reason)
            ctx.tracker.fail(run_id, reason)
            raise optuna.TrialPruned(reason)
        return backends

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

    def _before_training(
        self,
        trial: optuna.Trial,
        run_id: str,
        model: nn.Module,
        cfg: DictConfig,
        backends: list[str],
        workdir: Path,
        teacher: Mapping[str, Any] | None,
        deadline: float,
    ) -> LatencyKeys:
        """The heads the model kept and its latency keys recorded, its latencies known where
        anything decides on them before training (`_time_untrained`); returns the keys."""
        ctx = self.context
        self._record_kept_heads(trial, run_id, model)
        keys = trial_latency.latency_keys(cfg, structure_of(model), backends, ctx.protocol_record)
        keys = target.announced(ctx, trial, keys, deadline)
        self._time_untrained(model, cfg, keys, workdir, teacher, deadline)
        return keys

    def _time_untrained(
        self,
        model: nn.Module,
        cfg: DictConfig,
        keys: LatencyKeys,
        workdir: Path,
        teacher: Mapping[str, Any] | None,
        deadline: float,
    ) -> None:
        """Time the untrained model on every backend (or wait for the target machine's
        latencies of it), and refuse to train one over the latency budget
        (`NotWorthTraining`): never the teacher, which students need whatever its latency."""
        ctx = self.context
        if ctx.target_machine is not None:
            latencies = target.target_latencies(ctx, keys, deadline)
        # Only a latency budget and early stopping decide anything before training ends;
        # without them the trained artifacts are timed, converted only once.
        elif teacher is not None or not (
            ctx.pruning.enabled or ctx.constraints.latency_budget_ms is not None
        ):
            return
        else:
            latencies = trial_latency.before_training(ctx, model, cfg, keys, workdir / "untrained")
        if teacher is not None:
            return
        budget_ms = ctx.constraints.latency_budget_ms
        over_budget = over_budget_reason(latencies, budget_ms, ctx.protocol.statistic)
        if over_budget:
            raise NotWorthTraining(
                over_budget,
                0.0,
                trial_latency.fastest(latencies, ctx.protocol.statistic),
            )

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
        ctx.tracker.set_tags(run_id, {PRUNED_TAG: "true"})
        ctx.tracker.close(run_id, "KILLED", reason)
        messages.trial_pruned(trial.number, reason)

    def _lost_database(self, trial: optuna.Trial, exc: Exception) -> None:
        """The database was lost on a write that is never repeated (a run or a point made
        twice would stay): the trial is not the configuration's fault, so it is queued again
        like a dead worker's, its runs closed FAILED with the reason. Points it recorded stay;
        the retry deploys only the backends without one. Should the database stay away past
        `RETRY_SECONDS`, the trial is left without a reason of tuner's own, and whichever
        worker looks next queues it (`tuner.study.stale_trials.requeue_orphans`)."""
        ctx = self.context
        frozen = call_with_retries(ctx.storage.get_trial, trial_id_of(trial))
        queued = call_with_retries(
            requeue, ctx.leases, ctx.storage, ctx.study_id, frozen, ctx.max_retry
        )
        outcome = "queued again with the same params" if queued else "retries exhausted"
        reason = f"the database was lost mid-trial ({error_line(exc)}); {outcome}"
        trial.set_user_attr(FAIL_REASON_ATTR, reason)
        ctx.tracker.close_trained_in(str(ctx.cfg.study.name), trial.number, reason)
        messages.trial_lost_database(trial.number, reason)

    def _fail(self, trial: optuna.Trial, run_id: str, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        trial.set_user_attr(FAIL_REASON_ATTR, reason)
        self.context.tracker.fail(run_id, reason)
        messages.trial_failed(trial.number, reason, exc)

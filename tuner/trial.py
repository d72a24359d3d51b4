"""One trial: sample, build, edit, initialise, train once, then deploy on every backend.

Every listed backend is deployed; none is sampled. The trial carries its configuration's
representative point (`_representative`: the one that dominates the most area against the
study's hypervolume reference), which is what the sampler learns from; each other backend
becomes a point of its own, an Optuna trial added to the study with the same training params
and that backend, so the front and MLflow see one point per (trained config, backend) while the
model is trained only once. A backend that fails is a failed point; the trial fails only when
no backend deployed the model.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import torch
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState
from torch import nn

from tuner import budget, console
from tuner.backends import BACKENDS, ExampleInputs
from tuner.budget import BACKEND_KEY, TRAINED_IN_ATTR
from tuner.config import with_params
from tuner.constraints import (
    EAGER_ACCURACY_ATTR,
    Baseline,
    Constraints,
    baseline_of,
)
from tuner.convergence import REFERENCE_ATTR, reference_point
from tuner.data.batches import Encoded
from tuner.deploy import (
    BackendFailed,
    BackendResult,
    Reference,
    convert_into,
    deploy_on,
)
from tuner.early_stopping import (
    CURVE_ATTR,
    PRUNED_ATTR,
    SAMPLER_VIEW_ATTR,
    NotWorthTraining,
    PruningSettings,
    over_budget_reason,
    stop_reason,
)
from tuner.edits import apply_edits, resolved_edits
from tuner.front import (
    FAILED_BACKEND_ATTR,
    LATENCY_KEY_ATTR,
    MODEL_URI_ATTR,
    RUN_ID_ATTR,
    TEACHER_OF_ATTR,
    points_of,
)
from tuner.insight.measure import flops_per_call
from tuner.insight.point import INSIGHT_ATTR, PointInsight
from tuner.insight.roofline import MachinePeak, peak_key
from tuner.latency import (
    LatencyProtocol,
    LatencyResult,
    Timed,
    objective_name,
    time_rounds,
)
from tuner.latency_table import (
    LatencyTable,
    digest_of,
    latency_key,
    record_session,
    structure_of,
)
from tuner.modalities import Modality
from tuner.models import build_model
from tuner.optuna_compat import trial_id_of
from tuner.pareto import hypervolume, pareto_mask
from tuner.recipe import ModelRecipe
from tuner.recovery import deferred, immediate, raise_if_interrupted, requeue
from tuner.retrain import retrain_command, retrain_overrides
from tuner.serving import PointSpec, deploy_config, log_point_model
from tuner.space import SearchSpace, fits
from tuner.teacher import KEY as TEACHER_KEY
from tuner.teacher import (
    START_KEY,
    TEMPERATURE_KEY,
    Teachers,
    record_stored,
    starts_from_teacher,
    store_after_training,
    student_of,
    teacher_of,
)
from tuner.tracking import MODEL_ERROR_TAG, MODEL_URI_TAG, Tracker
from tuner.training import EpochResult, TrainResult, batch_loss, initialise_new_layers, train

# Optuna user attribute: what the trial's relative edits stand for (`model.ffn_width`: 1024).
ARCHITECTURE_ATTR = "architecture"
# Optuna user attribute of every point: the configuration it belongs to (`budget.configuration_of`).
CONFIGURATION_ATTR = "configuration"

_SUGGEST = {
    FloatDistribution: lambda trial, name, d: trial.suggest_float(
        name, d.low, d.high, step=d.step, log=d.log
    ),
    IntDistribution: lambda trial, name, d: trial.suggest_int(
        name, d.low, d.high, step=d.step, log=d.log
    ),
    CategoricalDistribution: lambda trial, name, d: trial.suggest_categorical(name, d.choices),
}


# Backend -> its latency key in the study's table; None for a backend whose graph depends on
# the trained weights (`Backend.graph_from_weights`): each of its artifacts is timed on its own.
LatencyKeys = Mapping[str, dict[str, Any] | None]


def _from_table(table: LatencyTable, keys: LatencyKeys) -> dict[str, LatencyResult | None]:
    """Each backend's latency as the table has it; None where unknown."""
    return {b: None if key is None else table.result(digest_of(key)) for b, key in keys.items()}


def _fastest(latencies: Mapping[str, LatencyResult | None], statistic: str) -> float:
    """The smallest known latency (by `statistic`) of a configuration's backends (NaN when none
    is known)."""
    return min(
        (r.ranked_ms(statistic) for r in latencies.values() if r is not None), default=math.nan
    )


def suggest(trial: optuna.Trial, space: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    return {name: _SUGGEST[type(d)](trial, name, d) for name, d in space.items()}


def untrained_model(
    cfg: DictConfig, build: Callable[[], nn.Module], teacher: nn.Module | None = None
) -> nn.Module:
    """A trial's model before training: `build`'s (the loaded model) edited and its new layers
    initialised, or the student of `teacher` (`tuner.teacher.student_of`); the global generator
    seeded with `train.seed` either way, since training's dropout draws from it next."""
    seed = int(cfg.train.seed)
    if teacher is not None:
        model = student_of(teacher, cfg.model, build)
        torch.manual_seed(seed)
        return model
    model = build()
    torch.manual_seed(seed)
    apply_edits(model, cfg.model)
    initialise_new_layers(model.new_layers(), str(cfg.train.init))
    return model


class ModelFactory:
    """Builds the base model once per model config and hands out copies.

    Loading pretrained weights costs seconds; structural edits only change keys that the cache
    ignores, so most trials start from a copy of one loaded model.
    """

    def __init__(self, num_labels: int, edit_keys: set[str]) -> None:
        self.num_labels = num_labels
        self.edit_keys = edit_keys
        self._key: str | None = None
        self._model: nn.Module | None = None

    def build(self, model_cfg: DictConfig, seed: int) -> nn.Module:
        return copy.deepcopy(self._base(model_cfg, seed))

    def architecture(self, model_cfg: DictConfig, seed: int) -> dict[str, Any]:
        """What the relative edits of `model_cfg` stand for on the unedited model; read off
        the cached model, which it does not change, so nothing is copied."""
        return resolved_edits(self._base(model_cfg, seed), model_cfg)

    def _base(self, model_cfg: DictConfig, seed: int) -> nn.Module:
        values = OmegaConf.to_container(model_cfg)
        assert isinstance(values, dict)
        key = json.dumps(
            {"seed": seed, **{k: v for k, v in values.items() if k not in self.edit_keys}},
            sort_keys=True,
            default=str,
        )
        if key != self._key or self._model is None:
            # Seeded on its own, so a random-init model is the same whether it is built first in
            # a process or copied from the cache (a retraining run builds it fresh).
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                self._model = build_model(model_cfg, self.num_labels)
            self._key = key
        return self._model


@dataclass(frozen=True)
class ServingContext:
    """What a logged model ships besides its artifact, and how its points are retrained."""

    modality: Modality
    # Where the modality saved its input pipeline, shipped with every logged model.
    inputs_dir: Path
    label_names: list[str]
    example_items: Sequence[Any]
    # The invocation's command-line overrides and configured study name (before any suffix).
    overrides: tuple[str, ...]
    study_name: str
    profile_keys: frozenset[str] = frozenset()


@dataclass
class TrialContext:
    """Everything trials share within one invocation."""

    cfg: DictConfig
    space: SearchSpace
    backends: list[str]
    constraints: Constraints
    train_data: Encoded
    val_data: Encoded
    # Batches of training inputs for backends that calibrate activation ranges.
    calibration: list[tuple[torch.Tensor, ...]]
    example: ExampleInputs
    protocol: LatencyProtocol
    # The protocol, the machine and the input shape, recorded with every point.
    protocol_record: dict[str, Any]
    factory: ModelFactory
    tracker: Tracker
    parent_run_id: str
    n_trials: int
    storage: optuna.storages.BaseStorage
    study_id: int
    max_retry: int
    serving: ServingContext
    pruning: PruningSettings
    # The study's distillation teacher; None when no trial distils.
    teachers: Teachers | None = None
    # This machine's peaks (`tuner.insight.roofline`), against which points are held; None
    # where they could not be measured.
    peak: MachinePeak | None = None

    def study_trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.storage.get_all_trials(self.study_id, deepcopy=False)

    @property
    def objective(self) -> str:
        """The latency objective's name (a point's metric), by the study's statistic."""
        return objective_name(self.protocol.statistic)

    def latency_table(self) -> LatencyTable:
        return LatencyTable.of_study(self.storage, self.study_id)

    def add_trial(self, trial: optuna.trial.FrozenTrial) -> int:
        """Add a finished trial to the study and return its number."""
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=trial)
        return self.storage.get_trial_number_from_id(trial_id)


@dataclass(frozen=True)
class _Trained:
    """A trained model, how it was trained, and its eager fp32 validation logits."""

    model: nn.Module
    params: dict[str, Any]
    # The absolute values of its relative edits (`tuner.edits.resolved_edits`).
    architecture: dict[str, Any]
    result: TrainResult
    reference: Reference
    # The configuration (`budget.configuration_of`) and the trial that trained it this time.
    configuration: int
    trained_in: int
    # The study's baseline once this model exists: every point of it is judged against it.
    baseline: Baseline
    # Backend -> the digest of this architecture's key in the study's latency table (None: the
    # backend's artifacts are timed each on its own).
    latency_keys: dict[str, str | None]
    # For a distilled model: where the teacher it learnt from is stored, where it started
    # from and at which temperature (`train.distill.teacher`, `train.distill.start_from`,
    # `train.distill.temperature`), pinned in its retraining command; empty when not distilled.
    teacher_pins: dict[str, Any] = field(default_factory=dict)
    # For the study's teacher: the `train.distill.teacher` reference it was trained for.
    teacher_for: str | None = None
    # Floating-point operations of one call at the deployment's input shape (None: the
    # counter failed on this model).
    flops: float | None = None


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
        console.trial_header(index, ctx.n_trials, trial.number, params)
        # What relative edits (fractions of the loaded model) stand for, recorded beside them.
        architecture = ctx.factory.architecture(cfg.model, int(cfg.train.seed))
        run_id = ctx.tracker.start_trial(
            ctx.parent_run_id,
            str(cfg.study.name),
            trial.number,
            None,
            self._logged_params({**params, **architecture}),
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
            trial.set_user_attr("fail_reason", reason)
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
                    model = self._untrained(cfg)
                    structure = structure_of(model)
                    keys = {
                        backend: None
                        if BACKENDS.get(backend).graph_from_weights
                        else latency_key(
                            cfg.model, structure, backend, cfg.deploy, ctx.protocol_record
                        )
                        for backend in backends
                    }
                    # Only a latency budget and early stopping decide anything before training
                    # ends; without them the trained artifacts are timed, converted only once.
                    # The teacher is trained whatever its latency: students need it.
                    if teacher is None and (
                        ctx.pruning.enabled or ctx.constraints.latency_budget_ms is not None
                    ):
                        latencies = self._latencies_before_training(
                            model, cfg, keys, Path(workdir) / "untrained"
                        )
                        budget_ms = ctx.constraints.latency_budget_ms
                        over_budget = over_budget_reason(
                            latencies, budget_ms, ctx.protocol.statistic
                        )
                        if over_budget:
                            raise NotWorthTraining(
                                over_budget, 0.0, _fastest(latencies, ctx.protocol.statistic)
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
                    )
                    results = self._deploy_everywhere(trained, backends, cfg, Path(workdir), keys)
                own_backend = (
                    carried if carried in results else self._representative(results, trained)
                )
                on_front = self._joining_front(results, trained)
                for backend, result in results.items():
                    if backend != own_backend:
                        self._add_point(trial, trained, result, backend in on_front)
                if own_backend is None:
                    raise BackendFailed(
                        "no backend deployed the model: "
                        + "; ".join(f"{b}: {r.error}" for b, r in results.items())
                    )
                self._own_backend(trial, run_id, own_backend, as_param=carried is None)
                own = results[own_backend]
                constraints = self._record(
                    trial.set_user_attr, run_id, trained, own, own_backend in on_front
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

    def _representative(
        self, results: Mapping[str, BackendResult], trained: _Trained
    ) -> str | None:
        """The backend whose point the trial carries, for the sampler: of the model's feasible
        points (all of them when none is feasible), the one that alone dominates the most area
        against the study's hypervolume reference; the earlier listed on ties. None when every
        backend failed."""
        ctx = self.context
        points = {
            backend: (result.val_accuracy, result.metrics()[ctx.objective])
            for backend, result in results.items()
            if not result.error
        }
        if not points:
            return None
        feasible = {
            backend: point
            for backend, point in points.items()
            if ctx.constraints.feasible(*point, trained.baseline)
        }
        pool = feasible or points
        # The study's reference, or the one it fixes when this first front is published.
        reference = reference_point(
            ctx.storage.get_study_user_attrs(ctx.study_id).get(REFERENCE_ATTR),
            ctx.cfg.study.hypervolume_reference,
            [latency for _, latency in points.values()],
        )
        assert reference is not None  # there are points
        order = list(results)

        def area(backend: str) -> tuple[float, int]:
            return hypervolume([pool[backend]], reference), -order.index(backend)

        return max(pool, key=area)

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

    def _logged_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A point's MLflow params, but its backend (`Tracker.set_backend` logs that)."""
        ctx = self.context
        logged = {**ctx.space.fixed, **params, **ctx.protocol_record}
        return {k: v for k, v in logged.items() if k != BACKEND_KEY}

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

    def _latencies_before_training(
        self, model: nn.Module, cfg: DictConfig, keys: LatencyKeys, workdir: Path
    ) -> dict[str, LatencyResult | None]:
        """Backend -> this architecture's latency there, from the study's latency table; keys
        it lacks are measured now on the untrained model, in interleaved rounds. None where the
        untrained model would not convert (the trained one is timed instead)."""
        ctx = self.context
        table = ctx.latency_table()
        missing = [b for b, key in keys.items() if key and table.round_count(digest_of(key)) == 0]
        measured = Timed({})
        if missing:
            model.eval()
            recipe = ModelRecipe.of(cfg.model, ctx.factory.num_labels)
            loaded = {}
            # Conversions and timing must not move the random stream training starts from.
            with torch.random.fork_rng():
                for backend in missing:
                    try:
                        loaded[backend] = convert_into(
                            workdir,
                            backend,
                            model,
                            recipe,
                            ctx.example,
                            cfg.deploy,
                            ctx.calibration,
                        ).logits_of
                    except Exception as exc:  # timed after training instead
                        console.untimed_before_training(backend, f"{type(exc).__name__}: {exc}")
                if loaded:
                    measured = time_rounds(
                        loaded, ctx.example, ctx.protocol, on_set_aside=console.rounds_set_aside
                    )
            for backend, timings in measured.rounds.items():
                key = keys[backend]
                assert key is not None
                record_session(ctx.storage, ctx.study_id, key, timings, measured.steady)
                table = table.adding(digest_of(key), timings, measured.steady)
        results = _from_table(table, keys)
        console.latencies_before_training(
            results, measured=list(measured.rounds), statistic=ctx.protocol.statistic
        )
        return results

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
    ) -> _Trained:
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
                trials, table = ctx.study_trials(), ctx.latency_table()
                # The latencies as the table stands now, as the front's points have them.
                latencies = _from_table(table, keys)
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
                        reason, epoch.val_accuracy, _fastest(latencies, ctx.protocol.statistic)
                    )

        def step_done(done: int, total: int, loss: float) -> None:
            raise_if_interrupted()
            progress.update(task, completed=done, total=total, loss=loss)

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
        if teacher_for is not None:
            # Stored before deployment: students need it whatever its backends do.
            uri = store_after_training(
                model,
                ModelRecipe.of(cfg.model, ctx.factory.num_labels),
                ctx.serving.label_names,
                lambda directory: ctx.tracker.log_directory(run_id, directory),
            )
            record_stored(ctx.storage, ctx.study_id, teacher_for, trial.number, uri)
        # Read once per trained model: every backend's point is judged against the same one.
        baseline = baseline_of(ctx.study_trials(), Baseline(reference.accuracy, trial.number))
        return _Trained(
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
        )

    def _deploy_everywhere(
        self,
        trained: _Trained,
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
                timer=lambda logits_of, key=keys[backend]: self._latency(logits_of, key),
            )
            results[backend] = result
        results.update(self._first_latencies(results, keys))
        for result in results.values():
            console.backend_result(result)
        return results

    def _latency(self, logits_of, key: Mapping[str, Any] | None) -> LatencyResult | None:
        """The key's latency from the study's table, with one more round timed on this
        deployed artifact while it has fewer than `max_rounds`; None for a key the table lacks,
        or no key (`_first_latencies` measures those)."""
        ctx = self.context
        if key is None:
            return None
        digest, table = digest_of(key), ctx.latency_table()
        have = table.round_count(digest)
        if have == 0:
            return None
        if have < ctx.protocol.max_rounds:
            # Judged as any round, silently: a line per backend's added round would bury the
            # trial's own lines.
            added = time_rounds({"": logits_of}, ctx.example, ctx.protocol, rounds=1)
            record_session(ctx.storage, ctx.study_id, key, added.rounds[""], added.steady)
            table = table.adding(digest, added.rounds[""], added.steady)
        return table.result(digest)

    def _first_latencies(
        self, results: Mapping[str, BackendResult], keys: LatencyKeys
    ) -> dict[str, BackendResult]:
        """The latencies the table lacks (or does not keep), measured on the trained artifacts
        in rounds interleaved across backends, recorded in the table where the backend has a
        key, and put on their results."""
        ctx = self.context
        waiting = {b: r.logits_of for b, r in results.items() if r.logits_of is not None}
        if not waiting:
            return {}
        try:
            measured = time_rounds(
                waiting, ctx.example, ctx.protocol, on_set_aside=console.rounds_set_aside
            )
        except Exception as exc:  # one backend's failure must not take the others' points
            console.interleaved_timing_failed(f"{type(exc).__name__}: {exc}")
            measured = Timed({})
        updated, table = {}, ctx.latency_table()
        for backend, logits_of in waiting.items():
            key = keys[backend]
            try:
                alone = (
                    measured
                    if backend in measured.rounds
                    else time_rounds(
                        {backend: logits_of},
                        ctx.example,
                        ctx.protocol,
                        on_set_aside=console.rounds_set_aside,
                    )
                )
                timings = alone.rounds[backend]
                if key is None:
                    latency = LatencyResult.of_rounds(timings)
                else:
                    record_session(ctx.storage, ctx.study_id, key, timings, alone.steady)
                    table = table.adding(digest_of(key), timings, alone.steady)
                    latency = table.result(digest_of(key))
            except Exception as exc:
                error = f"timing failed: {type(exc).__name__}: {exc}"
                updated[backend] = replace(results[backend], error=error, logits_of=None)
                continue
            updated[backend] = replace(results[backend], latency=latency, logits_of=None)
        return updated

    def _joining_front(self, results: Mapping[str, BackendResult], trained: _Trained) -> set[str]:
        """The backends whose points are on the feasible front once this model's points join
        the study. Only these are logged as models: a point dominated now mostly stays so (the
        best accuracy, and with it the accuracy constraint, only ever rises); one that a later
        latency lets on is tagged `tuner.model_absent` instead (`tuner.tracking`)."""
        ctx = self.context

        def feasible(accuracy: float, latency: float) -> bool:
            return ctx.constraints.feasible(accuracy, latency, trained.baseline)

        existing = [
            (p.val_accuracy, p.latency_ms)
            for p in points_of(ctx.study_trials(), table=ctx.latency_table())
            if feasible(p.val_accuracy, p.latency_ms)
        ]
        new = {
            backend: (result.val_accuracy, result.metrics()[ctx.objective])
            for backend, result in results.items()
            if not result.error
        }
        new = {backend: point for backend, point in new.items() if feasible(*point)}
        mask = pareto_mask(existing + list(new.values()))[len(existing) :]
        return {backend for backend, keep in zip(new, mask, strict=True) if keep}

    def _record(
        self,
        set_attr,
        run_id: str,
        trained: _Trained,
        result: BackendResult,
        log_model: bool,
    ) -> dict[str, float]:
        """Metrics and attributes of one point, whether the trial's own or an added one;
        returns its constraint values (none for a failed point), for its trial."""
        ctx = self.context
        params = {**trained.params, BACKEND_KEY: result.backend}
        # A distilled point retrains from the very teacher it learnt from, started as it was.
        overrides = retrain_overrides(
            ctx.serving.overrides,
            {**params, **trained.teacher_pins},
            ctx.serving.study_name,
            f"{trained.trained_in}-{result.backend}",
            ctx.serving.profile_keys,
        )
        ctx.tracker.set_tags(run_id, {"tuner.retrain": retrain_command(overrides)})
        set_attr(CONFIGURATION_ATTR, trained.configuration)
        set_attr(LATENCY_KEY_ATTR, trained.latency_keys.get(result.backend))
        if result.error:
            reason = f"backend {result.backend}: {result.error}"
            set_attr("fail_reason", reason)
            set_attr(FAILED_BACKEND_ATTR, result.backend)
            ctx.tracker.fail(run_id, reason)
            return {}
        if result.notes:
            ctx.tracker.log_notes(run_id, result.notes)
        if result.graph is not None:
            ctx.tracker.log_graph(run_id, result.graph)
        else:
            ctx.tracker.set_tags(run_id, {"graph.absent": result.graph_absent or ""})
        if result.profile is not None:
            ctx.tracker.log_profile(run_id, result.profile)
        else:
            ctx.tracker.set_tags(run_id, {"profile.absent": result.profile_absent or ""})
        metrics = {**result.metrics(), **self._insight(set_attr, run_id, trained, result)}
        for name in (
            "latency_ms_p95",
            "latency_rounds",
            "latency_spread_pct",
            "model_size_mb",
            "agreement_with_eager",
        ):
            set_attr(name, metrics[name])
        final = {**metrics, "train_seconds": trained.result.seconds}
        if trained.result.gpu_peak_mb is not None:
            final["train_gpu_peak_mb"] = trained.result.gpu_peak_mb
        ctx.tracker.log_metrics(run_id, final, step=len(trained.result.epochs))
        ctx.tracker.set_tags(run_id, {"train.trained_on": trained.result.trained_on})
        if log_model:
            self._log_model(set_attr, run_id, result, overrides, params)
        return ctx.constraints.values(result.val_accuracy, metrics[ctx.objective], trained.baseline)

    def _insight(
        self, set_attr, run_id: str, trained: _Trained, result: BackendResult
    ) -> dict[str, float]:
        """The point's `insight` attribute (`tuner.insight.point`); returns its FLOPs and
        roofline metrics, as far as they are known."""
        ctx = self.context
        assert result.latency is not None
        insight = PointInsight(
            profile_ms={}
            if result.profile is None
            else {name: ms for name, ms in result.profile.by_class_ms().items() if ms > 0},
            layout_ops=None if result.graph is None else result.graph.layout_ops,
            flops=trained.flops,
            precision=BACKENDS.get(result.backend).precision,
            peak_key=peak_key(ctx.protocol_record),
        )
        set_attr(INSIGHT_ATTR, insight.to_attr())
        if trained.flops is None:
            return {}
        if BACKENDS.get(result.backend).device != "cpu":
            # The peaks a study measures are its CPU's: a GPU point has no roof among them.
            return {"gflops_per_call": trained.flops / 1e9}
        peaks = {} if ctx.peak is None else {insight.peak_key: ctx.peak}
        latency = result.latency.ranked_ms(ctx.protocol.statistic)
        line = insight.roofline(latency, result.model_size_mb, peaks)
        if line is None:
            return {"gflops_per_call": trained.flops / 1e9}
        ctx.tracker.set_tags(run_id, {"roofline.bound": line.bound})
        return {"gflops_per_call": trained.flops / 1e9, **line.metrics()}

    def _log_model(
        self,
        set_attr,
        run_id: str,
        result: BackendResult,
        overrides: list[str],
        params: Mapping[str, Any],
    ) -> None:
        """Log the point's deployable model; a failure is recorded and the point kept."""
        ctx = self.context
        assert result.artifact is not None
        spec = PointSpec(
            backend=result.backend,
            modality=ctx.serving.modality.name,
            label_names=ctx.serving.label_names,
            # The deploy settings this point was made with, searched `deploy.*` keys included.
            deploy=deploy_config(with_params(ctx.cfg, params)),
        )
        try:
            uri = log_point_model(
                ctx.tracker.client,
                run_id,
                result.artifact,
                spec,
                ctx.serving.modality,
                ctx.serving.inputs_dir,
                ctx.serving.example_items,
                retrain_command(overrides),
                result.artifact.parent,
            )
        except Exception as exc:  # the point stays valid without its logged model
            reason = f"{type(exc).__name__}: {exc}"
            ctx.tracker.set_tags(run_id, {MODEL_ERROR_TAG: reason[:5000]})
            console.model_not_logged(result.backend, reason)
            return
        set_attr(MODEL_URI_ATTR, uri)
        ctx.tracker.set_tags(run_id, {MODEL_URI_TAG: uri})

    def _add_point(
        self, trial: optuna.Trial, trained: _Trained, result: BackendResult, log_model: bool
    ) -> None:
        """Another backend of the same trained model, as a trial of its own."""
        ctx = self.context
        params = {**trained.params, BACKEND_KEY: result.backend}
        run_id = ctx.tracker.start_trial(
            ctx.parent_run_id,
            str(ctx.cfg.study.name),
            None,
            result.backend,
            self._logged_params({**params, **trained.architecture}),
            trained_in_trial=trial.number,
        )
        ctx.tracker.replay_epochs(run_id, trained.result.epochs)
        user_attrs: dict[str, Any] = {
            RUN_ID_ATTR: run_id,
            BACKEND_KEY: result.backend,
            TRAINED_IN_ATTR: trial.number,
            EAGER_ACCURACY_ATTR: trained.reference.accuracy,
            ARCHITECTURE_ATTR: trained.architecture,
        }
        if trained.teacher_for is not None:
            user_attrs[TEACHER_OF_ATTR] = trained.teacher_for
        constraints = self._record(user_attrs.__setitem__, run_id, trained, result, log_model)
        # The teacher's values need not lie in the searched ranges; those that do are params.
        distributions = {
            name: d
            for name, d in ctx.space.distributions.items()
            if name in params and fits(d, params[name])
        }
        point = optuna.trial.create_trial(
            state=TrialState.FAIL if result.error else TrialState.COMPLETE,
            values=None if result.error else [result.val_accuracy, result.metrics()[ctx.objective]],
            params={name: params[name] for name in distributions},
            distributions=distributions,
            user_attrs=user_attrs,
        )
        for name, value in constraints.items():
            point.set_constraint(name, value)
        number = ctx.add_trial(point)
        ctx.tracker.set_trial_number(run_id, number, result.backend)
        if not result.error:
            ctx.tracker.finish(run_id)

    def _interrupted(self, trial: optuna.Trial) -> None:
        """Ctrl-C or SIGTERM: close this trial's runs as KILLED and queue it again."""
        ctx = self.context
        reason = "interrupted (Ctrl-C or SIGTERM); queued again with the same params"
        ctx.tracker.close_abandoned(str(ctx.cfg.study.name), trial.number, reason, "KILLED")
        frozen = ctx.storage.get_trial(trial_id_of(trial))
        requeue(ctx.storage, ctx.study_id, frozen, ctx.max_retry)

    def _pruned(self, trial: optuna.Trial, run_id: str, pruned: NotWorthTraining) -> None:
        """Not trained further: the run is closed KILLED with the reason (its epochs so far
        stay), and Optuna records the trial PRUNED; the sampler is shown it as the poor
        complete trial it stands for (`tuner.early_stopping.sampler_view`)."""
        reason = str(pruned)
        ctx = self.context
        view = pruned.sampler_view(ctx.constraints, baseline_of(ctx.study_trials()))
        trial.set_user_attr(SAMPLER_VIEW_ATTR, view)
        trial.set_user_attr(PRUNED_ATTR, reason)
        ctx.tracker.set_tags(run_id, {"tuner.pruned": "true"})
        ctx.tracker.close(run_id, "KILLED", reason)
        console.trial_pruned(trial.number, reason)

    def _fail(self, trial: optuna.Trial, run_id: str, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        trial.set_user_attr("fail_reason", reason)
        self.context.tracker.fail(run_id, reason)
        console.trial_failed(trial.number, reason, exc)

"""A trained model's points: which backend's point its trial carries (`representative`), which
join the front (`joining_front`), and each point's metrics, attributes, insight and logged model
(`record`), the trial's own or one added to the study as a trial of its own (`add_point`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState
from torch import nn

from tuner.config import fits, with_params
from tuner.deploy import (
    BACKENDS,
    BackendResult,
    PointSpec,
    Reference,
    deploy_config,
    log_point_model,
)
from tuner.front import Baseline, hypervolume, pareto_mask, points_of, reference_point
from tuner.insight import PointInsight, peak_key
from tuner.keys import (
    ARCHITECTURE_ATTR,
    BACKEND_KEY,
    CONFIGURATION_ATTR,
    DATA_SETTINGS_ATTR,
    EAGER_ACCURACY_ATTR,
    FAIL_REASON_ATTR,
    FAILED_BACKEND_ATTR,
    INSIGHT_ATTR,
    LATENCY_KEY_ATTR,
    MODEL_ERROR_TAG,
    MODEL_URI_ATTR,
    MODEL_URI_TAG,
    PREDICTIONS_ARTIFACT,
    REFERENCE_ATTR,
    RETRAIN_TAG,
    RUN_ID_ATTR,
    TEACHER_LOADED_TAG,
    TEACHER_OF_ATTR,
    TRAINED_IN_ATTR,
)
from tuner.store import data_fingerprint, settings_of
from tuner.tracking import retrain_command, retrain_overrides
from tuner.training import TrainResult
from tuner.trial import messages
from tuner.trial.context import TrialContext


@dataclass(frozen=True)
class Trained:
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
    # For the study's teacher loaded rather than trained (a retry of the trial that stored
    # it): where it is stored and which trial trained it.
    loaded_from: str | None = None


def representative(
    ctx: TrialContext, results: Mapping[str, BackendResult], trained: Trained
) -> str | None:
    """The backend whose point the trial carries, for the sampler: of the model's feasible
    points (all of them when none is feasible), the one that alone dominates the most area
    against the study's hypervolume reference; the earlier listed on ties. None when every
    backend failed."""
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


def joining_front(
    ctx: TrialContext, results: Mapping[str, BackendResult], trained: Trained
) -> set[str]:
    """The backends whose points are on the feasible front once this model's points join
    the study. Only these are logged as models: a point dominated now mostly stays so (the
    best accuracy, and with it the accuracy constraint, only ever rises); one that a later
    latency lets on is tagged `tuner.model_absent` instead (`tuner.tracking`)."""

    def feasible(accuracy: float, latency: float) -> bool:
        return ctx.constraints.feasible(accuracy, latency, trained.baseline)

    existing = [
        (p.val_accuracy, p.latency_ms)
        for p in points_of(ctx.split_trials(), table=ctx.latency_table())
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


def record(
    ctx: TrialContext,
    set_attr,
    run_id: str,
    trained: Trained,
    result: BackendResult,
    log_model: bool,
) -> dict[str, float]:
    """Metrics and attributes of one point, whether the trial's own or an added one;
    returns its constraint values (none for a failed point), for its trial."""
    params = {**trained.params, BACKEND_KEY: result.backend}
    # A distilled point retrains from the very teacher it learnt from, started as it was.
    overrides = retrain_overrides(
        ctx.serving.overrides,
        {**params, **trained.teacher_pins},
        ctx.serving.study_name,
        f"{trained.trained_in}-{result.backend}",
        ctx.serving.profile_keys,
    )
    ctx.tracker.set_tags(run_id, {RETRAIN_TAG: retrain_command(overrides)})
    if trained.loaded_from is not None:
        ctx.tracker.set_tags(run_id, {TEACHER_LOADED_TAG: trained.loaded_from})
    set_attr(CONFIGURATION_ATTR, trained.configuration)
    # The data settings it was trained and validated on, so that a later change of them leaves
    # this point out of a front measured on another split.
    set_attr(DATA_SETTINGS_ATTR, data_fingerprint(settings_of(ctx.cfg)))
    set_attr(LATENCY_KEY_ATTR, trained.latency_keys.get(result.backend))
    if result.error:
        reason = f"backend {result.backend}: {result.error}"
        set_attr(FAIL_REASON_ATTR, reason)
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
    metrics = {**result.metrics(), **_insight(ctx, set_attr, run_id, trained, result)}
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
        _log_model(ctx, set_attr, run_id, result, overrides, params)
    return ctx.constraints.values(result.val_accuracy, metrics[ctx.objective], trained.baseline)


def _insight(
    ctx: TrialContext, set_attr, run_id: str, trained: Trained, result: BackendResult
) -> dict[str, float]:
    """The point's `insight` attribute (`tuner.insight.point`); returns its FLOPs and
    roofline metrics, as far as they are known."""
    assert result.latency is not None
    insight = PointInsight(
        profile_ms={}
        if result.profile is None
        else {name: ms for name, ms in result.profile.by_class_ms().items() if ms > 0},
        layout_ops=None if result.graph is None else result.graph.layout_ops,
        flops=trained.flops,
        # A backend whose arithmetic follows a setting says which it took (`openvino`).
        precision=result.notes.get("precision", BACKENDS.get(result.backend).precision),
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
    ctx: TrialContext,
    set_attr,
    run_id: str,
    result: BackendResult,
    overrides: list[str],
    params: Mapping[str, Any],
) -> None:
    """Log the point's deployable model; a failure is recorded and the point kept."""
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
        messages.model_not_logged(result.backend, reason)
        return
    set_attr(MODEL_URI_ATTR, uri)
    ctx.tracker.set_tags(run_id, {MODEL_URI_TAG: uri})
    names = ctx.serving.label_names
    labels = [names[index] for index in result.val_predictions]
    ctx.tracker.client.log_dict(run_id, {"labels": labels}, PREDICTIONS_ARTIFACT)


def add_point(ctx: TrialContext, trained: Trained, result: BackendResult, log_model: bool) -> None:
    """Another backend of the same trained model, as a trial of its own."""
    params = {**trained.params, BACKEND_KEY: result.backend}
    run_id = ctx.tracker.start_trial(
        ctx.parent_run_id,
        str(ctx.cfg.study.name),
        None,
        result.backend,
        ctx.logged_params({**params, **trained.architecture}),
        trained_in_trial=trained.trained_in,
    )
    ctx.tracker.replay_epochs(run_id, trained.result.epochs)
    user_attrs: dict[str, Any] = {
        RUN_ID_ATTR: run_id,
        BACKEND_KEY: result.backend,
        TRAINED_IN_ATTR: trained.trained_in,
        EAGER_ACCURACY_ATTR: trained.reference.accuracy,
        ARCHITECTURE_ATTR: trained.architecture,
    }
    if trained.teacher_for is not None:
        user_attrs[TEACHER_OF_ATTR] = trained.teacher_for
    constraints = record(ctx, user_attrs.__setitem__, run_id, trained, result, log_model)
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

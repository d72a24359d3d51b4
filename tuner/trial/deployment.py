"""A trained model deployed on every backend left to it, and the points that makes recorded: the
trial carries one of them (the representative point, or the backend a retry carries), and each
other backend's becomes a trial of its own. A backend that fails is a failed point; the trial
fails only when no backend deployed the model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import optuna
from omegaconf import DictConfig
from optuna.distributions import CategoricalDistribution

from tuner.deploy import BackendFailed, BackendResult, deploy_on
from tuner.interrupts import raise_if_interrupted
from tuner.keys import BACKEND_KEY
from tuner.models import ModelRecipe
from tuner.store import trial_id_of
from tuner.trial import latency as trial_latency
from tuner.trial import messages
from tuner.trial import points as trial_points
from tuner.trial.context import TrialContext
from tuner.trial.latency import LatencyKeys
from tuner.trial.points import Trained


def deploy_everywhere(
    ctx: TrialContext,
    trained: Trained,
    backends: Sequence[str],
    cfg: DictConfig,
    workdir: Path,
    keys: LatencyKeys,
) -> dict[str, BackendResult]:
    """Each backend's result of deploying `trained`, in the order of `backends`, with the
    latencies timed once every backend's artifact exists."""
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


def record_points(
    ctx: TrialContext,
    trial: optuna.Trial,
    run_id: str,
    trained: Trained,
    results: dict[str, BackendResult],
    carried: str | None,
) -> tuple[str, BackendResult]:
    """Record every backend's point: each other backend's as a trial added to the study, then
    the trial's own, its constraints included. Returns the trial's own backend and result;
    raises `BackendFailed` when no backend deployed the model."""
    own_backend = (
        carried if carried in results else trial_points.representative(ctx, results, trained)
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
    _own_backend(ctx, trial, run_id, own_backend, as_param=carried is None)
    own = results[own_backend]
    constraints = trial_points.record(
        ctx, trial.set_user_attr, run_id, trained, own, own_backend in on_front
    )
    for name, value in constraints.items():
        trial.set_constraint(name, value)
    return own_backend, own


def _own_backend(
    ctx: TrialContext, trial: optuna.Trial, run_id: str, backend: str, as_param: bool
) -> None:
    """Record on the trial (and its MLflow run) the backend of the point it carries."""
    distribution = ctx.space.distributions.get(BACKEND_KEY)
    if as_param and isinstance(distribution, CategoricalDistribution):
        # A param, as for every point, though no sampler drew it.
        internal = distribution.to_internal_repr(backend)
        ctx.storage.set_trial_param(trial_id_of(trial), BACKEND_KEY, internal, distribution)
    trial.set_user_attr(BACKEND_KEY, backend)
    ctx.tracker.set_backend(run_id, trial.number, backend)

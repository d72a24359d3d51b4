"""Early stopping under two objectives: stop training a configuration none of whose points can
join the accuracy/latency front.

Optuna's pruners take one intermediate value and refuse multi-objective studies. Here a trial
knows its latencies before it trains (`tuner.store.latency_table`), so at each epoch end only its
accuracy is open. Its final eager accuracy is bounded optimistically by the accuracy so far plus
the largest gain any complete trial of the study made from the same epoch to its last, plus
`margin`; each backend's point by that plus the most that backend's points have ever gained over
their eager model. When every such optimistic point is dominated by a point already on the
feasible front (or is infeasible), the trial is stopped: Optuna records it PRUNED, which samplers
read as a bad configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna
from omegaconf import DictConfig
from optuna.trial import FrozenTrial, TrialState

from tuner.front.constraints import Baseline, Constraints, baseline_of
from tuner.front.pareto import dominates
from tuner.front.points import Point
from tuner.keys import BACKEND_KEY, CURVE_ATTR, EAGER_ACCURACY_ATTR, SAMPLER_VIEW_ATTR
from tuner.latency import LatencyResult
from tuner.store import completed_copy, is_configuration


class NotWorthTraining(optuna.TrialPruned):
    """A configuration that cannot put a point on the front: over the latency budget before
    training, or stopped at an epoch end. `accuracy` is its eager validation accuracy then (0
    before training), `latency` its fastest backend's."""

    def __init__(self, reason: str, accuracy: float, latency: float) -> None:
        super().__init__(reason)
        self.accuracy = accuracy
        self.latency = latency

    def sampler_view(self, constraints: Constraints, baseline: Baseline) -> dict:
        return {
            "values": [self.accuracy, self.latency],
            "constraints": constraints.values(self.accuracy, self.latency, baseline),
        }


def sampler_view(trial: FrozenTrial) -> FrozenTrial:
    """How the sampler sees `trial`: a pruned configuration as the complete, poor one it stands
    for; every other trial as it is."""
    view = trial.user_attrs.get(SAMPLER_VIEW_ATTR)
    if trial.state != TrialState.PRUNED or view is None:
        return trial
    return completed_copy(trial, view["values"], view["constraints"])


@dataclass(frozen=True)
class PruningSettings:
    """`study.pruning`: off by default (every configuration trains to the end).

    Attributes:
        min_epochs: epochs every trial trains before it may be stopped.
        margin: accuracy added to the optimistic bound (0.01 = one point), for gains larger
            than any seen so far.
        n_startup_trials: complete trials (trained to the last epoch) needed before any trial
            is stopped: the bound is learned from their curves.
    """

    enabled: bool = False
    min_epochs: int = 1
    margin: float = 0.02
    n_startup_trials: int = 2

    @classmethod
    def from_config(cls, pruning_cfg: DictConfig) -> PruningSettings:
        return cls(
            enabled=bool(pruning_cfg.enabled),
            min_epochs=int(pruning_cfg.min_epochs),
            margin=float(pruning_cfg.margin),
            n_startup_trials=int(pruning_cfg.n_startup_trials),
        )


def gain_still_to_come(
    trials: Sequence[FrozenTrial], epoch: int, epochs: int, n_startup: int
) -> float | None:
    """The largest accuracy gain from `epoch` to the last of `epochs` among complete trials
    that trained all of them; None while fewer than `n_startup` exist."""
    curves = [
        t.user_attrs[CURVE_ATTR]
        for t in trials
        if t.state == TrialState.COMPLETE
        and is_configuration(t)
        and len(t.user_attrs.get(CURVE_ATTR, [])) == epochs
    ]
    if len(curves) < max(1, n_startup):
        return None
    return max(float(curve[-1]) - float(curve[epoch - 1]) for curve in curves)


def backend_gains(trials: Sequence[FrozenTrial]) -> dict[str, float]:
    """Per backend, the most any of its points gained over its eager model (0 at least)."""
    gains: dict[str, float] = {}
    for t in trials:
        eager = t.user_attrs.get(EAGER_ACCURACY_ATTR)
        if t.state != TrialState.COMPLETE or eager is None or not math.isfinite(eager):
            continue
        backend = str(t.user_attrs.get(BACKEND_KEY, ""))
        gains[backend] = max(gains.get(backend, 0.0), t.values[0] - float(eager))
    return gains


def _dominated_by(accuracy: float, latency: float, points: Sequence[Point]) -> Point | None:
    return next(
        (p for p in points if dominates((p.val_accuracy, p.latency_ms), (accuracy, latency))),
        None,
    )


def stop_reason(
    accuracy: float,
    epoch: int,
    epochs: int,
    latency_ms: Mapping[str, float | None],
    trials: Sequence[FrozenTrial],
    points: Sequence[Point],
    constraints: Constraints,
    settings: PruningSettings,
) -> str | None:
    """Why a trial at `epoch` of `epochs` with eager validation `accuracy` cannot put any point
    on the front, or None when it might (or when too little is known to say).

    Args:
        latency_ms: backend -> this architecture's latency there, by the study's statistic
            (None: unknown).
        points: the study's points, feasibility and front as they stand.
    """
    if not settings.enabled or epoch < settings.min_epochs or epoch >= epochs:
        return None
    if not latency_ms or any(latency is None for latency in latency_ms.values()):
        return None
    gain = gain_still_to_come(trials, epoch, epochs, settings.n_startup_trials)
    if gain is None:
        return None
    eager_bound = accuracy + max(gain, 0.0) + settings.margin
    per_backend = backend_gains(trials)
    fallback = max(per_backend.values(), default=0.0)
    front = [p for p in points if p.pareto]
    baseline = baseline_of(trials)
    blocked = []
    for backend, latency in latency_ms.items():
        assert latency is not None
        bound = eager_bound + per_backend.get(backend, fallback)
        if not constraints.feasible(bound, latency, baseline):
            blocked.append(f"{backend} ({bound:.4f}, {latency:.2f} ms) infeasible")
            continue
        winner = _dominated_by(bound, latency, front)
        if winner is None:
            return None
        blocked.append(
            f"{backend} ({bound:.4f}, {latency:.2f} ms) dominated by trial "
            f"#{winner.trial_number} ({winner.val_accuracy:.4f}, {winner.latency_ms:.2f} ms)"
        )
    return (
        f"stopped after epoch {epoch} of {epochs}: val_accuracy {accuracy:.4f} can reach at most "
        f"{eager_bound:.4f} (largest gain seen from epoch {epoch}: {gain:+.4f}, margin "
        f"{settings.margin:g}); no point can join the front: " + "; ".join(blocked)
    )


def over_budget_reason(
    latencies: Mapping[str, LatencyResult | None], budget_ms: float | None, statistic: str
) -> str | None:
    """Why a configuration need not be trained at all: every backend's latency is known and
    even its fastest round's median, and its latency by the study's `statistic`, are over
    `study.latency_budget_ms` (noise only slows calls down, so one noisy measurement does not
    rule an architecture out for good). None otherwise."""
    if budget_ms is None or not latencies:
        return None
    if any(
        r is None or min(r.fastest_round_ms, r.ranked_ms(statistic)) <= budget_ms
        for r in latencies.values()
    ):
        return None
    listed = ", ".join(
        f"{backend} {r.p50_ms:.2f} ms (fastest round {r.fastest_round_ms:.2f}, "
        f"fastest call {r.min_ms:.2f})"
        for backend, r in latencies.items()
        if r is not None
    )
    return f"every backend is over study.latency_budget_ms={budget_ms:g} before training: {listed}"

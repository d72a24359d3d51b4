"""How far the search has got: the hypervolume of the feasible front.

The hypervolume is that of the front as it stands: the points feasible against the study's
current baseline (`tuner.constraints`). It is not monotone: when a better model raises the
baseline under `study.max_accuracy_drop`, points that were feasible drop out and it can fall.
It is logged with the number of trained configurations as its step (other backends' points of
one model are not steps of the search) and, as `search_seconds`, the wall-clock seconds since
the study's first trial started.

Hypervolume curves are only comparable against one reference point, so the study fixes it once
(in its Optuna user attributes) and every later invocation or worker reuses it: the configured
`study.hypervolume_reference` (a study setting, see `tuner.settings`), or, where its latency is
null, twice the slowest point known when the first front was published.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import optuna
from omegaconf import DictConfig

from tuner.front import Point
from tuner.pareto import hypervolume

REFERENCE_ATTR = "hypervolume_reference"


@dataclass(frozen=True)
class Convergence:
    hypervolume: float
    reference: tuple[float, float]
    front_size: int

    search_seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "hypervolume": self.hypervolume,
            "pareto_points": float(self.front_size),
            "search_seconds": self.search_seconds,
        }


def reference_point(
    stored: list[float] | None, configured: DictConfig, latencies: list[float]
) -> tuple[float, float] | None:
    """The reference (worst accuracy, worst latency): the study's `stored` one, else the
    configured one with a null latency taken as twice the slowest of `latencies`; None while
    there is nothing to take it from."""
    if stored is not None:
        return float(stored[0]), float(stored[1])
    if configured.latency_ms_p50 is not None:
        latency = float(configured.latency_ms_p50)
    elif latencies:
        latency = 2.0 * max(latencies)
    else:
        return None
    return float(configured.val_accuracy), latency


def hypervolume_reference(
    study: optuna.Study, configured: DictConfig, points: list[Point]
) -> tuple[float, float] | None:
    """The study's reference, fixed in the study the first time it can be taken."""
    stored = study.user_attrs.get(REFERENCE_ATTR)
    reference = reference_point(stored, configured, [p.latency_ms for p in points])
    if stored is None and reference is not None:
        study.set_user_attr(REFERENCE_ATTR, list(reference))
    return reference


def convergence(
    study: optuna.Study,
    configured: DictConfig,
    points: list[Point],
    started: datetime | None = None,
) -> Convergence | None:
    """The hypervolume of `points`; `started` (when the study's first trial began) gives
    `search_seconds`."""
    reference = hypervolume_reference(study, configured, points)
    if reference is None:
        return None
    feasible = [(p.val_accuracy, p.latency_ms) for p in points if p.feasible]
    seconds = (datetime.now() - started).total_seconds() if started else 0.0
    return Convergence(
        hypervolume(feasible, reference), reference, sum(p.pareto for p in points), seconds
    )

"""How far the search has got: the hypervolume of the feasible front.

Hypervolume curves are only comparable against one reference point, so the study fixes it once
(in its Optuna user attributes) and every later invocation or worker reuses it: the configured
`study.hypervolume_reference`, or, where its latency is null, twice the slowest point known when
the first front was published.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def metrics(self) -> dict[str, float]:
        return {"hypervolume": self.hypervolume, "pareto_points": float(self.front_size)}


def hypervolume_reference(
    study: optuna.Study, configured: DictConfig, points: list[Point]
) -> tuple[float, float] | None:
    """The study's reference (worst accuracy, worst latency); None until a point exists."""
    stored = study.user_attrs.get(REFERENCE_ATTR)
    accuracy = float(configured.val_accuracy)
    if configured.latency_ms_p50 is not None:
        latency = float(configured.latency_ms_p50)
    elif stored is not None:
        latency = float(stored[1])
    elif points:
        latency = 2.0 * max(p.latency_ms_p50 for p in points)
    else:
        return None
    reference = (accuracy, latency)
    if stored is None or tuple(stored) != reference:
        study.set_user_attr(REFERENCE_ATTR, list(reference))
    return reference


def convergence(
    study: optuna.Study, configured: DictConfig, points: list[Point]
) -> Convergence | None:
    reference = hypervolume_reference(study, configured, points)
    if reference is None:
        return None
    feasible = [(p.val_accuracy, p.latency_ms_p50) for p in points if p.feasible]
    return Convergence(hypervolume(feasible, reference), reference, sum(p.pareto for p in points))

"""How far the search has got: the hypervolume of the feasible front.

The hypervolume is that of the front as it stands: the points feasible against the study's
current baseline (`tuner.front.constraints`). It is not monotone: when a better model raises the
baseline under `study.max_accuracy_drop`, points that were feasible drop out and it can fall.
It is logged with the number of trained configurations as its step (other backends' points of
one model are not steps of the search) and, as `search_seconds`, the wall-clock seconds since
the study's first trial started.

Hypervolume curves are only comparable against one reference point, so the study fixes it once
(in its Optuna user attributes) and every later invocation or worker reuses it: the configured
`study.hypervolume_reference` (a study setting, see `tuner.store.settings`), or, where its latency
is null, twice the slowest point known when the first front was published.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import optuna
from omegaconf import DictConfig

from tuner.front.constraints import Baseline
from tuner.front.pareto import hypervolume
from tuner.front.points import Point
from tuner.keys import REFERENCE_ATTR


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
    study: optuna.Study, configured: DictConfig, points: list[Point], machine: str | None = None
) -> tuple[float, float] | None:
    """The study's reference, fixed in the study the first time it can be taken; with a
    `machine`, that machine's own (its latencies are of another scale)."""
    name = REFERENCE_ATTR if machine is None else f"{REFERENCE_ATTR}:{machine}"
    stored = study.user_attrs.get(name)
    reference = reference_point(stored, configured, [p.latency_ms for p in points])
    if stored is None and reference is not None:
        study.set_user_attr(name, list(reference))
    return reference


def convergence(
    study: optuna.Study,
    configured: DictConfig,
    points: list[Point],
    started: datetime | None = None,
    machine: str | None = None,
) -> Convergence | None:
    """The hypervolume of `points` (at `machine`'s latencies, against its reference);
    `started` (when the study's first trial began) gives `search_seconds`."""
    reference = hypervolume_reference(study, configured, points, machine)
    if reference is None:
        return None
    feasible = [(p.val_accuracy, p.latency_ms) for p in points if p.feasible]
    seconds = (datetime.now() - started).total_seconds() if started else 0.0
    return Convergence(
        hypervolume(feasible, reference), reference, sum(p.pareto for p in points), seconds
    )


def front_note(
    study_name: str,
    points: list[Point],
    progress: Convergence | None,
    protocol: Mapping[str, Any],
    baseline: Baseline,
    machine: str | None = None,
) -> str:
    """The parent run's description in MLflow: the front and how its latency was measured;
    with a `machine`, its front at that machine's latencies."""
    front = sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms)
    folder = "pareto" if machine is None else f"pareto/{machine}"
    metric = "hypervolume" if machine is None else f"hypervolume.{machine}"
    on = "" if machine is None else f" on machine `{machine}`"
    lines = [
        f"**Study `{study_name}`**{on}: {len(points)} points, {len(front)} on the feasible "
        f"accuracy/latency front (`{folder}/front.csv`, `{folder}/front.html`).",
        "",
    ]
    if progress is not None:
        accuracy, latency = progress.reference
        lines += [
            f"Hypervolume {progress.hypervolume:.4g} (accuracy x ms, reference accuracy "
            f"{accuracy:g}, latency {latency:.3g} ms); its history is the `{metric}` metric.",
            "",
        ]
    if front:
        lines += [
            f"| trial | backend | val_accuracy | {front[0].latency_statistic} ms | p95 ms | MB |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {p.trial_number} | {p.backend} | {p.val_accuracy:.4f} | {p.latency_ms:.2f} "
            f"| {p.latency_ms_p95:.2f} | {p.model_size_mb:.1f} |"
            for p in front
        ]
        lines.append("")
    lines += [f"Feasibility and accuracy drops are against {baseline.describe()}.", ""]
    lines.append(
        "Latency protocol: "
        + ", ".join(f"{key.removeprefix('latency.')}={value}" for key, value in protocol.items())
    )
    return "\n".join(lines)

"""The study's points and Pareto front as a table and a plot, read from the Optuna study."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from tuner.constraints import Constraints, best_reference_accuracy
from tuner.pareto import pareto_mask

METRIC_COLUMNS = ("val_accuracy", "latency_ms_p50", "latency_ms_p95", "model_size_mb")


@dataclass(frozen=True)
class Point:
    """One trained configuration deployed on one backend."""

    trial_number: int
    backend: str
    val_accuracy: float
    latency_ms_p50: float
    latency_ms_p95: float
    model_size_mb: float
    trained_in_trial: int
    params: dict[str, Any] = field(default_factory=dict)
    feasible: bool = True
    pareto: bool = False


def study_points(study: optuna.Study, constraints: Constraints | None = None) -> list[Point]:
    """Every complete trial as a point; `pareto` marks the front of the feasible ones.

    Feasibility is recomputed here against the best eager accuracy in the whole study, so it is
    right even for points made before that best model existed.
    """
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    constraints = constraints or Constraints()
    best = best_reference_accuracy(trials)
    points = [
        Point(
            trial_number=trial.number,
            backend=str(trial.user_attrs.get("deploy.backend", "")),
            val_accuracy=trial.values[0],
            latency_ms_p50=trial.values[1],
            latency_ms_p95=float(trial.user_attrs.get("latency_ms_p95", float("nan"))),
            model_size_mb=float(trial.user_attrs.get("model_size_mb", float("nan"))),
            trained_in_trial=int(trial.user_attrs.get("trained_in_trial", trial.number)),
            params=dict(trial.params),
            feasible=constraints.feasible(trial.values[0], trial.values[1], best),
        )
        for trial in trials
    ]
    feasible = [p for p in points if p.feasible]
    on_front = {
        p.trial_number
        for p, keep in zip(
            feasible,
            pareto_mask([(p.val_accuracy, p.latency_ms_p50) for p in feasible]),
            strict=True,
        )
        if keep
    }
    return [replace(p, pareto=p.trial_number in on_front) for p in points]


def front_table(points: list[Point]) -> pd.DataFrame:
    """The front, fastest first: trial, backend, metrics, then the dotted params."""
    rows = [
        {
            "trial": p.trial_number,
            "backend": p.backend,
            **{name: getattr(p, name) for name in METRIC_COLUMNS},
            "trained_in_trial": p.trained_in_trial,
            **p.params,
        }
        for p in points
        if p.pareto
    ]
    table = pd.DataFrame(rows)
    return table.sort_values("latency_ms_p50").reset_index(drop=True) if rows else table


def plot_front(points: list[Point], title: str, path: Path) -> None:
    """Accuracy against latency coloured by backend: the front solid and joined, dominated
    points faded, infeasible ones faded crosses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5), dpi=120)
    backends = sorted({p.backend for p in points})
    colours = {b: plt.get_cmap("tab10")(i % 10) for i, b in enumerate(backends)}
    for backend in backends:
        mine = [p for p in points if p.backend == backend]
        for group, style in (
            ([p for p in mine if p.pareto], {"alpha": 1.0, "edgecolors": "black", "s": 55}),
            ([p for p in mine if p.feasible and not p.pareto], {"alpha": 0.35, "s": 35}),
            ([p for p in mine if not p.feasible], {"alpha": 0.35, "marker": "x", "s": 35}),
        ):
            if group:
                axes.scatter(
                    [p.latency_ms_p50 for p in group],
                    [p.val_accuracy for p in group],
                    color=colours[backend],
                    zorder=3,
                    **style,
                )
        axes.scatter([], [], color=colours[backend], label=backend)
    front = sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms_p50)
    axes.step(
        [p.latency_ms_p50 for p in front],
        [p.val_accuracy for p in front],
        where="post",
        color="black",
        alpha=0.5,
        label="Pareto front",
    )
    for p in front:
        axes.annotate(f"#{p.trial_number}", (p.latency_ms_p50, p.val_accuracy), fontsize=8)
    if any(not p.feasible for p in points):
        axes.scatter([], [], color="gray", marker="x", alpha=0.5, label="infeasible")
    axes.set_xlabel("latency p50 (ms)")
    axes.set_ylabel("validation accuracy")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)

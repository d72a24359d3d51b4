"""The study's points and Pareto front as a table and a plot, read from the Optuna study."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

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
    params: dict[str, Any] = field(default_factory=dict)
    pareto: bool = False


def study_points(study: optuna.Study) -> list[Point]:
    """Every complete trial as a point, with `pareto` set against all of them."""
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    points = [
        Point(
            trial_number=trial.number,
            backend=str(trial.user_attrs.get("deploy.backend", "")),
            val_accuracy=trial.values[0],
            latency_ms_p50=trial.values[1],
            latency_ms_p95=float(trial.user_attrs.get("latency_ms_p95", float("nan"))),
            model_size_mb=float(trial.user_attrs.get("model_size_mb", float("nan"))),
            params=dict(trial.params),
        )
        for trial in trials
    ]
    mask = pareto_mask([(p.val_accuracy, p.latency_ms_p50) for p in points])
    return [replace(p, pareto=on_front) for p, on_front in zip(points, mask, strict=True)]


def front_table(points: list[Point]) -> pd.DataFrame:
    """The front, fastest first: trial, backend, metrics, then the dotted params."""
    rows = [
        {
            "trial": p.trial_number,
            "backend": p.backend,
            **{name: getattr(p, name) for name in METRIC_COLUMNS},
            **p.params,
        }
        for p in points
        if p.pareto
    ]
    table = pd.DataFrame(rows)
    return table.sort_values("latency_ms_p50").reset_index(drop=True) if rows else table


def plot_front(points: list[Point], title: str, path: Path) -> None:
    """Accuracy against latency, front points joined and highlighted, dominated ones faded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    dominated = [p for p in points if not p.pareto]
    front = sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms_p50)
    axes.scatter(
        [p.latency_ms_p50 for p in dominated],
        [p.val_accuracy for p in dominated],
        color="tab:gray",
        alpha=0.4,
        label="dominated",
    )
    axes.step(
        [p.latency_ms_p50 for p in front],
        [p.val_accuracy for p in front],
        where="post",
        color="tab:blue",
        alpha=0.6,
    )
    axes.scatter(
        [p.latency_ms_p50 for p in front],
        [p.val_accuracy for p in front],
        color="tab:blue",
        label="Pareto front",
        zorder=3,
    )
    for p in front:
        axes.annotate(f"#{p.trial_number}", (p.latency_ms_p50, p.val_accuracy), fontsize=8)
    axes.set_xlabel("latency p50 (ms)")
    axes.set_ylabel("validation accuracy")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)

"""The study's points and Pareto front, read from the Optuna study, and the front as a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import optuna
import pandas as pd

from tuner.budget import DUPLICATE_ATTR, retried_numbers
from tuner.constraints import Baseline, Constraints, baseline_of
from tuner.insight.point import INSIGHT_ATTR, PointInsight
from tuner.latency import DEFAULT_STATISTIC, objective_name
from tuner.pareto import pareto_mask

if TYPE_CHECKING:
    from tuner.convergence import Convergence
    from tuner.latency_table import LatencyTable

# Optuna user attributes that tie a point to its MLflow run and logged model.
RUN_ID_ATTR = "mlflow_run_id"
MODEL_URI_ATTR = "mlflow_model_uri"
# Set on every trial tuner fails (a failed point or trial), with why; a failed trial without
# it was failed by Optuna: its worker died or was interrupted.
FAIL_REASON_ATTR = "fail_reason"
# Set on a failed trial whose model trained but whose backend failed: a failed point.
FAILED_BACKEND_ATTR = "failed_backend"
# The digest of a point's latency key in the study's latency table (`tuner.latency_table`).
LATENCY_KEY_ATTR = "latency_key"
# Set on every point of a study's distillation teacher: the `train.distill.teacher` reference
# it was trained for. The teacher trains with fixed values, not sampled params, so its points
# show this in their params.
TEACHER_OF_ATTR = "distill_teacher_of"


@dataclass(frozen=True)
class Point:
    """One trained configuration deployed on one backend.

    Attributes:
        latency_ms: its latency as the study ranks it: its `latency_statistic` (p50, min; see
            `tuner.latency.LATENCY_STATISTICS`) of its timed calls.
    """

    trial_number: int
    backend: str
    val_accuracy: float
    latency_ms: float
    latency_ms_p95: float
    model_size_mb: float
    trained_in_trial: int
    params: dict[str, Any] = field(default_factory=dict)
    feasible: bool = True
    pareto: bool = False
    # Where the point's deployable model was logged (MLflow model URI), if it was.
    model_uri: str | None = None
    mlflow_run_id: str | None = None
    # Where its time goes (`tuner.insight.point`); None for a point made by an older version.
    insight: PointInsight | None = None
    latency_statistic: str = DEFAULT_STATISTIC

    @property
    def status(self) -> str:
        """How plots show it: on the front, dominated, or infeasible."""
        if not self.feasible:
            return "infeasible"
        return "pareto" if self.pareto else "dominated"


@dataclass(frozen=True)
class Failures:
    """Failed points (a backend failed on a trained model) and failed trials (training or
    setup failed, so no point at all). An interrupted trial that was queued again is neither,
    nor a duplicate teacher trial (never run)."""

    points: int = 0
    trials: int = 0


def failures_of(trials: Sequence[optuna.trial.FrozenTrial]) -> Failures:
    retried = retried_numbers(trials)
    failed = [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.FAIL
        and t.number not in retried
        and DUPLICATE_ATTR not in t.system_attrs
    ]
    points = sum(1 for t in failed if FAILED_BACKEND_ATTR in t.user_attrs)
    return Failures(points=points, trials=len(failed) - points)


def study_points(study: optuna.Study, constraints: Constraints | None = None) -> list[Point]:
    """Every complete trial of the study made on its current data settings as a point (a point
    of another split is left out: `tuner.data_settings`); see `points_of`."""
    from tuner.data_settings import current_split
    from tuner.latency_table import LatencyTable

    table = LatencyTable.of_attrs(study.user_attrs)
    trials = current_split(study.get_trials(deepcopy=False), study.user_attrs).trials
    return points_of(trials, constraints, table)


def points_of(
    trials: Sequence[optuna.trial.FrozenTrial],
    constraints: Constraints | None = None,
    table: LatencyTable | None = None,
) -> list[Point]:
    """Every complete trial as a point; `pareto` marks the front of the feasible ones.

    Feasibility is recomputed here against the study's baseline (`tuner.constraints`), so it is
    right even for points made before the model that sets it existed. With the study's latency
    `table`, a point's latency is its key's as the table now stands (rounds added since the point
    was made included), summarised by the study's statistic, so every point of one architecture
    and backend has the same; a point made before the study had a table keeps the latency it was
    measured with.
    """
    trials = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    constraints = constraints or Constraints()
    statistic = table.statistic if table else DEFAULT_STATISTIC
    baseline = baseline_of(trials)

    def latency_of(trial: optuna.trial.FrozenTrial) -> tuple[float, float]:
        measured = table.result(trial.user_attrs.get(LATENCY_KEY_ATTR)) if table else None
        if measured is None:
            return trial.values[1], float(trial.user_attrs.get("latency_ms_p95", float("nan")))
        return measured.ranked_ms(statistic), measured.p95_ms

    points = [
        Point(
            trial_number=trial.number,
            backend=str(trial.user_attrs.get("deploy.backend", "")),
            val_accuracy=trial.values[0],
            latency_ms=latency,
            latency_ms_p95=p95,
            model_size_mb=float(trial.user_attrs.get("model_size_mb", float("nan"))),
            trained_in_trial=int(trial.user_attrs.get("trained_in_trial", trial.number)),
            params=dict(trial.params)
            | (
                {"teacher": trial.user_attrs[TEACHER_OF_ATTR]}
                if TEACHER_OF_ATTR in trial.user_attrs
                else {}
            ),
            feasible=constraints.feasible(trial.values[0], latency, baseline),
            model_uri=trial.user_attrs.get(MODEL_URI_ATTR),
            mlflow_run_id=trial.user_attrs.get(RUN_ID_ATTR),
            insight=PointInsight.of_attr(trial.user_attrs.get(INSIGHT_ATTR)),
            latency_statistic=statistic,
        )
        for trial in trials
        for latency, p95 in [latency_of(trial)]
    ]
    feasible = [p for p in points if p.feasible]
    on_front = {
        p.trial_number
        for p, keep in zip(
            feasible,
            pareto_mask([(p.val_accuracy, p.latency_ms) for p in feasible]),
            strict=True,
        )
        if keep
    }
    return [replace(p, pareto=p.trial_number in on_front) for p in points]


def front_table(points: list[Point]) -> pd.DataFrame:
    """The front, fastest first: trial, backend, metrics (the latency under its objective's
    name), then the dotted params."""
    rows = [
        {
            "trial": p.trial_number,
            "backend": p.backend,
            "val_accuracy": p.val_accuracy,
            objective_name(p.latency_statistic): p.latency_ms,
            "latency_ms_p95": p.latency_ms_p95,
            "model_size_mb": p.model_size_mb,
            "trained_in_trial": p.trained_in_trial,
            **p.params,
        }
        for p in points
        if p.pareto
    ]
    if not rows:
        return pd.DataFrame(rows)
    latency = objective_name(points[0].latency_statistic)
    return pd.DataFrame(rows).sort_values(latency).reset_index(drop=True)


def front_note(
    study_name: str,
    points: list[Point],
    progress: Convergence | None,
    protocol: Mapping[str, Any],
    baseline: Baseline,
) -> str:
    """The parent run's description in MLflow: the front and how its latency was measured."""
    front = sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms)
    lines = [
        f"**Study `{study_name}`**: {len(points)} points, {len(front)} on the feasible "
        "accuracy/latency front (`pareto/front.csv`, `pareto/front.html`).",
        "",
    ]
    if progress is not None:
        accuracy, latency = progress.reference
        lines += [
            f"Hypervolume {progress.hypervolume:.4g} (accuracy x ms, reference accuracy "
            f"{accuracy:g}, latency {latency:.3g} ms); its history is the `hypervolume` metric.",
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

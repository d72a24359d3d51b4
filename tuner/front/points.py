"""The study's points and Pareto front, read from the Optuna study, and the front as a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import optuna
import pandas as pd

from tuner.front.constraints import Constraints, baseline_of
from tuner.front.pareto import pareto_mask
from tuner.insight import PointInsight
from tuner.keys import (
    DUPLICATE_ATTR,
    FAILED_BACKEND_ATTR,
    INSIGHT_ATTR,
    LATENCY_KEY_ATTR,
    MODEL_URI_ATTR,
    RUN_ID_ATTR,
    TEACHER_OF_ATTR,
)
from tuner.latency import DEFAULT_STATISTIC, objective_name
from tuner.store import retried_numbers

if TYPE_CHECKING:
    from tuner.store import LatencyTable


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
    of another split is left out: `tuner.store.data_settings`); see `points_of`."""
    from tuner.store import LatencyTable, current_split

    table = LatencyTable.of_attrs(study.user_attrs)
    trials = current_split(study.get_trials(deepcopy=False), study.user_attrs).trials
    return points_of(trials, constraints, table)


def points_of(
    trials: Sequence[optuna.trial.FrozenTrial],
    constraints: Constraints | None = None,
    table: LatencyTable | None = None,
    on: Mapping[str, Any] | None = None,
) -> list[Point]:
    """Every complete trial as a point; `pareto` marks the front of the feasible ones.

    Feasibility is recomputed here against the study's baseline (`tuner.front.constraints`), so it
    is right even for points made before the model that sets it existed. With the study's latency
    `table`, a point's latency is its key's as the table now stands (rounds added since the point
    was made included), summarised by the study's statistic, so every point of one architecture
    and backend has the same; a point made before the study had a table keeps the latency it was
    measured with.

    `on`: another machine's protocol record (`tuner.store.machines`): each point at its
    latency on that machine, from `table`; points that machine has not measured are left out.
    """
    trials = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    constraints = constraints or Constraints()
    statistic = table.statistic if table else DEFAULT_STATISTIC
    baseline = baseline_of(trials)

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
        for latency, p95 in [_latency_of(trial, table, on) or (None, None)]
        if latency is not None
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


def _latency_of(
    trial: optuna.trial.FrozenTrial, table: LatencyTable | None, on: Mapping[str, Any] | None
) -> tuple[float, float] | None:
    """A point's latency (by the table's statistic) and p95: its key's in the table, else what
    it was made with; on another machine (`on`), its key's there, else None."""
    digest = trial.user_attrs.get(LATENCY_KEY_ATTR)
    if on is not None:
        digest = table.digest_on(digest, on) if table else None
        measured = table.result(digest) if table and digest else None
        return None if measured is None else (measured.ranked_ms(table.statistic), measured.p95_ms)
    measured = table.result(digest) if table else None
    if measured is None:
        return trial.values[1], float(trial.user_attrs.get("latency_ms_p95", float("nan")))
    return measured.ranked_ms(table.statistic), measured.p95_ms


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

"""Feasibility: an accuracy-drop limit and a latency budget, as Optuna constraints, and the
baseline the drop is measured from.

A point is feasible when every constraint value is <= 0 (Optuna's convention); the values are
set on each point's trial under their names (`Trial.set_constraint`), where samplers and
`study.best_trials` read them. The one baseline
of a study is the best eager fp32 validation accuracy of any trained model with a complete point
(`baseline_of`); the sampler's constraint values, which points get a logged model, the `pareto`
tags, the console's comparisons and the report's rule all use it. It only rises as better
models complete: samplers keep the values computed when each point was made, and the front
(`tuner.front`) is recomputed against the latest baseline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from omegaconf import DictConfig
from optuna.trial import TrialState

from tuner.keys import EAGER_ACCURACY_ATTR


@dataclass(frozen=True)
class Baseline:
    """The best eager fp32 validation accuracy, and the trial that trained that model (None
    while no model has a complete point)."""

    accuracy: float = math.nan
    trained_in_trial: int | None = None

    def describe(self) -> str:
        if self.trained_in_trial is None:
            return "no trained model yet"
        return (
            f"the best eager fp32 validation accuracy, {self.accuracy:.4f} "
            f"(model of trial #{self.trained_in_trial})"
        )


def baseline_of(
    trials: Sequence[optuna.trial.FrozenTrial], pending: Baseline | None = None
) -> Baseline:
    """The study's baseline among the complete points of `trials`, and `pending`: a model just
    trained whose points are being made. Ties go to the earlier model."""
    candidates = [pending] if pending is not None and math.isfinite(pending.accuracy) else []
    for trial in trials:
        accuracy = trial.user_attrs.get(EAGER_ACCURACY_ATTR)
        if trial.state == TrialState.COMPLETE and accuracy is not None and math.isfinite(accuracy):
            trained_in = int(trial.user_attrs.get("trained_in_trial", trial.number))
            candidates.append(Baseline(float(accuracy), trained_in))
    return min(
        candidates,
        key=lambda b: (-b.accuracy, b.trained_in_trial),
        default=Baseline(),
    )


def drop_beyond(best: float, val_accuracy: float, max_drop: float) -> float:
    """How far `val_accuracy` lies below `best` beyond `max_drop` (<= 0: within it). Rounded to
    12 decimals: accuracies are fractions of the validation set, whose float differences carry
    errors of ~1e-17, and a point exactly at the limit (0.85 under 0.86 with a drop of 0.01)
    must be within it; one example in a million is still 1e-6."""
    return round(best - val_accuracy - max_drop, 12)


@dataclass(frozen=True)
class Constraints:
    """`max_accuracy_drop` in accuracy units (0.01 = one point) below the baseline;
    `latency_budget_ms` on the latency the study ranks by (`deploy.latency.statistic`)."""

    max_accuracy_drop: float | None = None
    latency_budget_ms: float | None = None

    @classmethod
    def of_settings(cls, settings: Mapping[str, Any]) -> Constraints:
        """From a study's recorded settings (`tuner.store.settings`: flat keys)."""
        return cls(settings.get("study.max_accuracy_drop"), settings.get("study.latency_budget_ms"))

    @classmethod
    def from_config(cls, study_cfg: DictConfig) -> Constraints:
        drop, budget = study_cfg.get("max_accuracy_drop"), study_cfg.get("latency_budget_ms")
        return cls(None if drop is None else float(drop), None if budget is None else float(budget))

    def describe(self) -> str:
        """The constraints that are set, as the study's keys."""
        keys = {
            "study.max_accuracy_drop": self.max_accuracy_drop,
            "study.latency_budget_ms": self.latency_budget_ms,
        }
        return ", ".join(f"{key}={value:g}" for key, value in keys.items() if value is not None)

    def values(
        self, val_accuracy: float, latency_ms: float, baseline: Baseline
    ) -> dict[str, float]:
        """Constraint name -> value, for the constraints that are set."""
        result = {}
        if self.max_accuracy_drop is not None:
            # Before any baseline exists a point is judged against its own model only.
            best = baseline.accuracy if math.isfinite(baseline.accuracy) else val_accuracy
            result["accuracy_drop"] = drop_beyond(best, val_accuracy, self.max_accuracy_drop)
        if self.latency_budget_ms is not None:
            result["latency_budget"] = latency_ms - self.latency_budget_ms
        return result

    def feasible(self, val_accuracy: float, latency_ms: float, baseline: Baseline) -> bool:
        return all(v <= 0 for v in self.values(val_accuracy, latency_ms, baseline).values())

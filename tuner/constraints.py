"""Feasibility: an accuracy-drop limit and a latency budget, as Optuna constraints.

A point is feasible when every value is <= 0 (Optuna's convention). The accuracy drop is
measured from the best eager fp32 accuracy of any trained model in the study, so it tightens
as better models appear: samplers see the values computed when each point was made, and the
front (`tuner.front`) recomputes feasibility against the final best.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import optuna
from omegaconf import DictConfig

# Optuna's samplers keep constraint values under this system attribute; points added to the
# study directly (one per extra backend) must carry it too.
from optuna.samplers._base import _CONSTRAINTS_KEY as CONSTRAINTS_KEY  # noqa: F401

REFERENCE_ACCURACY_ATTR = "reference_accuracy"
CONSTRAINTS_ATTR = "constraints"


@dataclass(frozen=True)
class Constraints:
    """`max_accuracy_drop` in accuracy units (0.01 = one point); `latency_budget_ms` on p50."""

    max_accuracy_drop: float | None = None
    latency_budget_ms: float | None = None

    @classmethod
    def from_config(cls, study_cfg: DictConfig) -> Constraints:
        drop, budget = study_cfg.get("max_accuracy_drop"), study_cfg.get("latency_budget_ms")
        return cls(None if drop is None else float(drop), None if budget is None else float(budget))

    @property
    def active(self) -> bool:
        return self.max_accuracy_drop is not None or self.latency_budget_ms is not None

    def values(
        self, val_accuracy: float, latency_ms_p50: float, best_reference: float
    ) -> list[float]:
        result = []
        if self.max_accuracy_drop is not None:
            result.append(best_reference - val_accuracy - self.max_accuracy_drop)
        if self.latency_budget_ms is not None:
            result.append(latency_ms_p50 - self.latency_budget_ms)
        return result

    def feasible(self, val_accuracy: float, latency_ms_p50: float, best_reference: float) -> bool:
        return all(v <= 0 for v in self.values(val_accuracy, latency_ms_p50, best_reference))


def best_reference_accuracy(trials: Sequence[optuna.trial.FrozenTrial]) -> float:
    """The best eager fp32 validation accuracy of any trained model among `trials`."""
    values = [t.user_attrs.get(REFERENCE_ACCURACY_ATTR) for t in trials]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return max(finite, default=float("nan"))


def constraints_func(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
    """For samplers: the values the objective stored on the trial."""
    return list(trial.user_attrs.get(CONSTRAINTS_ATTR, []))

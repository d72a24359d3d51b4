"""Which point of the front to deploy, under a rule the user states.

The default rule is the common one for shipping: the fastest point within one accuracy point of
the study's baseline, the best eager fp32 model (`tuner.front.constraints.baseline_of`, the same
baseline the constraints and the console use). A latency budget instead picks the most accurate
point that fits it; with both, the fastest point within the drop that also fits the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.front.constraints import Baseline, drop_beyond
from tuner.front.points import Point

DEFAULT_MAX_ACCURACY_DROP = 0.01


@dataclass(frozen=True)
class Rule:
    """`max_accuracy_drop` in accuracy units (0.01 = one point) below the study's baseline;
    `max_latency_ms` on the latency the study ranks by (`deploy.latency.statistic`). Either may
    be None."""

    max_accuracy_drop: float | None = DEFAULT_MAX_ACCURACY_DROP
    max_latency_ms: float | None = None

    def describe(self) -> str:
        if self.max_accuracy_drop is None and self.max_latency_ms is None:
            return "the most accurate point"
        parts = []
        if self.max_accuracy_drop is not None:
            parts.append(
                f"the fastest point within {100 * self.max_accuracy_drop:g} accuracy point(s) "
                "of the best eager fp32 model"
            )
        else:
            parts.append("the most accurate point")
        if self.max_latency_ms is not None:
            parts.append(f"with latency <= {self.max_latency_ms:g} ms")
        return " ".join(parts)


def recommend(points: list[Point], rule: Rule, baseline: Baseline) -> Point | None:
    """The front point the rule picks, or None when no point satisfies it.

    Ties go to the more accurate, then the faster, then the earlier point, so the answer does
    not depend on the order points were read in.
    """
    front = [p for p in points if p.pareto]
    if not front:
        return None
    # No model with a recorded eager accuracy (points added by hand or by other tools): the
    # front's most accurate point stands in.
    best_accuracy = (
        baseline.accuracy
        if math.isfinite(baseline.accuracy)
        else max(p.val_accuracy for p in front)
    )
    candidates = [
        p
        for p in front
        if (rule.max_latency_ms is None or p.latency_ms <= rule.max_latency_ms)
        and (
            rule.max_accuracy_drop is None
            or drop_beyond(best_accuracy, p.val_accuracy, rule.max_accuracy_drop) <= 0
        )
    ]
    if not candidates:
        return None
    if rule.max_accuracy_drop is None:
        return min(candidates, key=lambda p: (-p.val_accuracy, p.latency_ms, p.trial_number))
    return min(candidates, key=lambda p: (p.latency_ms, -p.val_accuracy, p.trial_number))

"""What a point keeps about where its time goes, on its Optuna trial (user attribute `insight`),
so that the front's picture and the report read it from the study alone: one profiled call's
milliseconds by op class, the shipped graph's layout-op count, and what its roofline needs (the
architecture's FLOPs per call, the precision its backend computes in, the machine whose peaks it
is held against)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.insight.roofline import MachinePeak, Roofline, roofline


@dataclass(frozen=True)
class PointInsight:
    """Attributes:
    profile_ms: op class -> milliseconds of one profiled call (empty: not profiled).
    layout_ops: the shipped graph's layout and memory ops (None: no graph dump).
    flops: floating-point operations per call of the architecture (None: not counted).
    precision: the backend's arithmetic (`Backend.precision`).
    peak_key: the machine whose peaks the roofline uses (`roofline.peak_key`).
    """

    profile_ms: dict[str, float] = field(default_factory=dict)
    layout_ops: int | None = None
    flops: float | None = None
    precision: str = "fp32"
    peak_key: str | None = None

    def to_attr(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of_attr(cls, value: Any) -> PointInsight | None:
        """From a trial's attribute; None for a point that has none (made by an older version)."""
        if not isinstance(value, Mapping):
            return None
        return cls(
            profile_ms={str(k): float(v) for k, v in dict(value.get("profile_ms") or {}).items()},
            layout_ops=value.get("layout_ops"),
            flops=value.get("flops"),
            precision=str(value.get("precision", "fp32")),
            peak_key=value.get("peak_key"),
        )

    @property
    def profiled(self) -> bool:
        return bool(self.profile_ms)

    @property
    def profiled_ms(self) -> float:
        return sum(self.profile_ms.values())

    def top_classes(self, count: int = 3) -> list[tuple[str, float, float]]:
        """The `count` op classes that took most of the profiled call: (class, ms, share)."""
        total = self.profiled_ms or 1.0
        ranked = sorted(self.profile_ms.items(), key=lambda item: -item[1])[:count]
        return [(name, ms, ms / total) for name, ms in ranked if ms > 0]

    def roofline(
        self, latency_ms: float, weight_mb: float, peaks: Mapping[str, MachinePeak]
    ) -> Roofline | None:
        """The point against its machine's roofline, or None when something it needs is
        missing (FLOPs not counted, no peak for its machine, no artifact size)."""
        peak = peaks.get(self.peak_key or "")
        if self.flops is None or peak is None:
            return None
        return roofline(self.flops, weight_mb * 1e6, latency_ms, self.precision, peak)

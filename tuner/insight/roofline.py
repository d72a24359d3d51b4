"""How close a point comes to what the machine can do: the machine's peaks, and a point's
achieved throughput against the roofline they draw.

A point's achieved throughput is its architecture's FLOPs per call over its latency (by the
study's statistic, `deploy.latency.statistic`); the roofline's attainable throughput is the
smaller of the peak of the precision its backend computes in and its arithmetic intensity
(FLOPs per byte of weights read per call, a lower bound on the traffic at batch 1) times the
bandwidth. `roofline_fraction` is their ratio: near 1, the kernels run at the machine's limit;
far below, time goes to something other than arithmetic (layout ops, dispatch, small shapes).
Measuring the peaks and counting FLOPs is `tuner.latency.peak`'s job; this module needs no
torch, so the front can read it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tuner.keys import PEAK_ATTR_PREFIX

FP32, BF16, INT8 = "fp32", "bf16", "int8"
PRECISIONS = (FP32, BF16, INT8)


@dataclass(frozen=True)
class MachinePeak:
    """The machine's measured limits under `threads` threads.

    Attributes:
        gemm_gflops: precision (`fp32`, `bf16`, `int8`) -> GEMM throughput in G(FL)OP/s.
        bandwidth_gbs: memory bandwidth in GB/s (bytes read plus bytes written per second).
    """

    gemm_gflops: dict[str, float]
    bandwidth_gbs: float
    threads: int

    def to_attr(self) -> dict[str, Any]:
        return asdict(self)

    def record(self, prefix: str = "") -> dict[str, float]:
        """Flat values for a run's params, e.g. `fp32_gflops`, `bandwidth_gbs`."""
        values = {f"{name}_gflops": value for name, value in self.gemm_gflops.items()}
        values["bandwidth_gbs"] = self.bandwidth_gbs
        return {f"{prefix}{name}": round(value, 1) for name, value in values.items()}

    @classmethod
    def of_attr(cls, value: Mapping[str, Any]) -> MachinePeak:
        return cls(dict(value["gemm_gflops"]), float(value["bandwidth_gbs"]), int(value["threads"]))


@dataclass(frozen=True)
class Roofline:
    """One point against the machine's roofline (throughputs in GFLOP/s)."""

    achieved_gflops: float
    attainable_gflops: float
    # `compute` when the precision's peak is the lower roof, `memory` when bandwidth is.
    bound: str

    @property
    def fraction(self) -> float:
        return self.achieved_gflops / self.attainable_gflops

    def metrics(self) -> dict[str, float]:
        return {"achieved_gflops": self.achieved_gflops, "roofline_fraction": self.fraction}

    def describe(self, precision: str) -> str:
        """E.g. `29.5% of 721 GFLOP/s (int8 peak)`, or `(memory bandwidth)` where that roof
        is the lower."""
        roof = f"{precision} peak" if self.bound == "compute" else "memory bandwidth"
        return f"{self.fraction:.1%} of {self.attainable_gflops:.0f} GFLOP/s ({roof})"


def roofline(
    flops: float, weight_bytes: float, latency_ms: float, precision: str, peak: MachinePeak
) -> Roofline | None:
    """Where a call of `flops` over `weight_bytes` of weights taking `latency_ms` stands; None
    where a roof cannot be drawn (no FLOPs, no weights, no time, or no peak measured for the
    precision)."""
    if not (flops > 0 and weight_bytes > 0 and latency_ms > 0):
        return None
    if not peak.gemm_gflops.get(precision, 0) > 0 or not peak.bandwidth_gbs > 0:
        return None
    compute = peak.gemm_gflops[precision]
    memory = flops / weight_bytes * peak.bandwidth_gbs
    return Roofline(
        achieved_gflops=flops / (latency_ms / 1000) / 1e9,
        attainable_gflops=min(compute, memory),
        bound="compute" if compute <= memory else "memory",
    )


def peak_key(protocol_record: Mapping[str, Any]) -> str:
    """The digest of the machine a peak belongs to: CPU model and instruction sets, threads,
    torch version and any caps on its kernels, out of a latency protocol's record
    (`LatencyProtocol.record`)."""
    machine = {
        name: value
        for name, value in protocol_record.items()
        if name.removeprefix("latency.")
        in ("cpu", "cpu_flags", "num_threads", "torch_version", "kernel_caps")
    }
    return hashlib.sha256(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:20]


def stored_peaks(user_attrs: Mapping[str, Any]) -> dict[str, MachinePeak]:
    """Machine key -> the peaks a study keeps for it."""
    return {
        name.removeprefix(PEAK_ATTR_PREFIX): MachinePeak.of_attr(value)
        for name, value in user_attrs.items()
        if name.startswith(PEAK_ATTR_PREFIX) and isinstance(value, Mapping)
    }

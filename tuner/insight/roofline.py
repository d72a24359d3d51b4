"""How close a point comes to what the machine can do.

The machine's peaks are measured once per study and machine, under the latency protocol's
thread count: GEMM throughput in fp32, bf16 and int8 (int8 x int8 -> int32) and memory bandwidth
(a large copy). A model's FLOPs per call are counted on its eager model (`FlopCounterMode`:
matmuls, convolutions and attention), the same for every backend of one architecture. A point's
achieved throughput is those FLOPs over its p50 latency; the roofline's attainable throughput is
the smaller of the peak of the precision its backend computes in and its arithmetic intensity
(FLOPs per byte of weights read per call, a lower bound on the traffic at batch 1) times the
bandwidth. `roofline_fraction` is their ratio: near 1, the kernels run at the machine's limit;
far below, time goes to something other than arithmetic (layout ops, dispatch, small shapes).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from tuner.latency import pinned_threads

FP32, BF16, INT8 = "fp32", "bf16", "int8"
PRECISIONS = (FP32, BF16, INT8)
# The study user attribute holding the peaks measured on one machine (its digest follows).
PEAK_ATTR_PREFIX = "machine_peak:"

# Square GEMMs this large keep every core busy and run at the kernels' best rate.
_GEMM_SIZE = 1024
# Bytes copied per bandwidth sample: far beyond any last-level cache.
_COPY_BYTES = 256 * 2**20
# Each peak is the best of repeated samples over at least this long.
_SAMPLE_SECONDS = 0.3


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


def roofline(
    flops: float, weight_bytes: float, latency_ms: float, precision: str, peak: MachinePeak
) -> Roofline:
    """Where a call of `flops` over `weight_bytes` of weights taking `latency_ms` stands."""
    compute = peak.gemm_gflops[precision]
    memory = flops / weight_bytes * peak.bandwidth_gbs
    return Roofline(
        achieved_gflops=flops / (latency_ms / 1000) / 1e9,
        attainable_gflops=min(compute, memory),
        bound="compute" if compute <= memory else "memory",
    )


def _cpu_attention_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Q K^T and the weighted sum of V, from the shapes (batch, heads, sequence, head dim)."""
    batch, heads, queries, depth = query
    keys = key[-2]
    return 2 * batch * heads * queries * keys * (depth + value[-1])


def flops_per_call(model: nn.Module, tensors: tuple[torch.Tensor, ...]) -> float:
    """Floating-point operations of one eager call on `tensors` (a multiply-add counts two)."""
    from torch.utils.flop_counter import FlopCounterMode

    # PyTorch counts its GPU attention kernels but not the CPU one attention dispatches to here.
    counter = FlopCounterMode(
        display=False,
        custom_mapping={
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops
        },
    )
    with torch.inference_mode(), counter:
        model.eval()(*tensors)
    return float(counter.get_total_flops())


def _best_rate(work: float, run: Callable[[], object]) -> float:
    """`work` units per second of `run`, the best of samples taken over `_SAMPLE_SECONDS`."""
    run()  # warm-up: allocation and kernel selection
    best, spent = 0.0, 0.0
    while spent < _SAMPLE_SECONDS or best == 0.0:
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
        spent += seconds
        best = max(best, work / seconds)
    return best


def _gemm(precision: str) -> Callable[[], object]:
    n = _GEMM_SIZE
    if precision == INT8:
        a = torch.randint(-128, 128, (n, n), dtype=torch.int8)
        b = torch.randint(-128, 128, (n, n), dtype=torch.int8)
        return lambda: torch._int_mm(a, b)
    dtype = torch.bfloat16 if precision == BF16 else torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return lambda: torch.mm(a, b)


def measure_peak(threads: int) -> MachinePeak:
    """The machine's GEMM peaks and bandwidth under `threads` threads (about 1-2 s)."""
    with pinned_threads(threads), torch.inference_mode():
        gemm = {
            precision: _best_rate(2 * _GEMM_SIZE**3, _gemm(precision)) / 1e9
            for precision in PRECISIONS
        }
        source = torch.empty(_COPY_BYTES // 4, dtype=torch.float32).fill_(1.0)
        target = torch.empty_like(source)
        bandwidth = _best_rate(2 * _COPY_BYTES, lambda: target.copy_(source)) / 1e9
    return MachinePeak(gemm, bandwidth, threads)


def peak_key(protocol_record: Mapping[str, Any]) -> str:
    """The digest of the machine a peak belongs to: CPU model and instruction sets, threads
    and torch version, out of a latency protocol's record (`LatencyProtocol.record`)."""
    machine = {
        name: value
        for name, value in protocol_record.items()
        if name.removeprefix("latency.") in ("cpu", "cpu_flags", "num_threads", "torch_version")
    }
    return hashlib.sha256(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:20]


def stored_peaks(user_attrs: Mapping[str, Any]) -> dict[str, MachinePeak]:
    """Machine key -> the peaks a study keeps for it."""
    return {
        name.removeprefix(PEAK_ATTR_PREFIX): MachinePeak.of_attr(value)
        for name, value in user_attrs.items()
        if name.startswith(PEAK_ATTR_PREFIX) and isinstance(value, Mapping)
    }


def study_peak(study, protocol_record: Mapping[str, Any], threads: int) -> MachinePeak:
    """The study's peak for this machine: measured the first time the machine runs the study,
    then read back by every worker and resume. Stored in one write, so a worker stopped while
    measuring leaves nothing half-done."""
    key = peak_key(protocol_record)
    peak = stored_peaks(study.user_attrs).get(key)
    if peak is None:
        peak = measure_peak(threads)
        study.set_user_attr(f"{PEAK_ATTR_PREFIX}{key}", peak.to_attr())
    return peak

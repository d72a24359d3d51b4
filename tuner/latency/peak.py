"""Measuring what the roofline needs (`tuner.insight.roofline`): the machine's peaks, once per
study and machine, under the latency protocol's thread count (GEMM throughput in fp32, bf16 and
int8 x int8 -> int32, and memory bandwidth from a large copy), and a model's FLOPs per call,
counted on its eager model (`FlopCounterMode`: matmuls, convolutions and attention), the same
for every backend of one architecture."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from tuner.insight import BF16, INT8, PRECISIONS, MachinePeak, peak_key, stored_peaks
from tuner.keys import PEAK_ATTR_PREFIX
from tuner.latency.protocol import pinned_threads

# Square GEMMs this large keep every core busy and run at the kernels' best rate.
_GEMM_SIZE = 1024
# Bytes copied per bandwidth sample: far beyond any last-level cache.
_COPY_BYTES = 256 * 2**20
# Each peak is the best of repeated samples over at least this long.
_SAMPLE_SECONDS = 0.3


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


def _gemm_peaks() -> dict[str, float]:
    """GFLOP/s per precision. One whose GEMM this build of PyTorch cannot run on this CPU is
    left out: its backends' points get no roofline, the others still do."""
    peaks = {}
    for precision in PRECISIONS:
        try:
            peaks[precision] = _best_rate(2 * _GEMM_SIZE**3, _gemm(precision)) / 1e9
        except RuntimeError:
            continue
    return peaks


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
        gemm = _gemm_peaks()
        source = torch.empty(_COPY_BYTES // 4, dtype=torch.float32).fill_(1.0)
        target = torch.empty_like(source)
        bandwidth = _best_rate(2 * _COPY_BYTES, lambda: target.copy_(source)) / 1e9
    return MachinePeak(gemm, bandwidth, threads)


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

"""One latency protocol for every backend: pinned threads, warm-up, repeated timed calls.

Shared CPUs are noisy, so the protocol reports the median and the 95th percentile of many calls
and records everything needed to compare two measurements (batch, sequence length, threads,
repeats, CPU model and instruction sets, torch version).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from tuner.backends.base import ExampleInputs
from tuner.backends.cpu import isa_flags


@dataclass(frozen=True)
class LatencyProtocol:
    batch_size: int
    seq_len: int
    num_threads: int
    warmup: int
    repeats: int

    @classmethod
    def from_config(cls, latency_cfg: DictConfig) -> LatencyProtocol:
        return cls(**{name: int(latency_cfg[name]) for name in cls.__dataclass_fields__})

    def record(self, prefix: str = "") -> dict[str, str | int]:
        """The protocol and the machine it ran on, as recorded with every measurement."""
        values = {
            **asdict(self),
            "cpu": cpu_model(),
            "cpu_flags": isa_flags(),
            "torch_version": torch.__version__,
        }
        return {f"{prefix}{key}": value for key, value in values.items()}


@dataclass(frozen=True)
class LatencyResult:
    p50_ms: float
    p95_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    samples_ms: list[float] = field(default_factory=list, repr=False)


@cache
def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@contextmanager
def pinned_threads(num_threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def measure_latency(
    logits_of: Callable[..., torch.Tensor],
    inputs: ExampleInputs,
    protocol: LatencyProtocol,
) -> LatencyResult:
    timings = []
    with pinned_threads(protocol.num_threads), torch.inference_mode():
        for _ in range(protocol.warmup):
            logits_of(*inputs.tensors)
        for _ in range(protocol.repeats):
            started = time.perf_counter()
            logits_of(*inputs.tensors)
            timings.append((time.perf_counter() - started) * 1000)
    values = np.array(timings)
    return LatencyResult(
        p50_ms=float(np.percentile(values, 50)),
        p95_ms=float(np.percentile(values, 95)),
        mean_ms=float(values.mean()),
        min_ms=float(values.min()),
        max_ms=float(values.max()),
        samples_ms=timings,
    )

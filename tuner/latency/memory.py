"""Peak resident memory of this process while a block runs, sampled from /proc."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_STATM = Path("/proc/self/statm")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """Current resident set size, or 0 where /proc is not available."""
    try:
        return int(_STATM.read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class PeakMemory:
    baseline_bytes: int = 0
    peak_bytes: int = 0

    @property
    def growth_mb(self) -> float:
        """How far the peak rose above the resident size at the start, in MB."""
        return max(self.peak_bytes - self.baseline_bytes, 0) / 1e6


# The name of the thread that samples the resident size.
SAMPLER_THREAD = "tuner-memory-sampler"


@contextmanager
def track_peak_memory(interval_s: float = 0.005) -> Iterator[PeakMemory]:
    """Sample the resident size in a thread; a sampler misses spikes shorter than `interval_s`."""
    result = PeakMemory(resident_bytes(), resident_bytes())
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval_s):
            result.peak_bytes = max(result.peak_bytes, resident_bytes())

    sampler = threading.Thread(target=sample, daemon=True, name=SAMPLER_THREAD)
    sampler.start()
    try:
        yield result
    finally:
        stop.set()
        sampler.join()
        result.peak_bytes = max(result.peak_bytes, resident_bytes())

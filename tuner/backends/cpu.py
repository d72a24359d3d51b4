"""What this CPU offers, as the backends' availability checks need it."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def cpu_flags() -> frozenset[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return frozenset()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()

"""Where one call of a deployed model spends its time, by operator and class, from the
backend's own profiler: ONNX Runtime's session profiling for ONNX graphs, `torch.profiler` for
PyTorch artifacts. Profiled after the timed calls and apart from them, for the point's MLflow
run (`profile/ops.csv` and a metric per class)."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from tuner.insight.op_classes import by_class, op_class

Row = tuple[str, int, float]  # op type, calls, total milliseconds
# Calls profiled (for ONNX Runtime, after a warm-up one); the one of median length is kept:
# one call can be slowed down many times over by anything else running on a shared machine.
PROFILED_RUNS = 3
# `layout/memory` -> `layout_memory` in a metric's name.
_NOT_A_NAME = re.compile(r"\W+")


@dataclass(frozen=True)
class OpProfile:
    """One call's operators: (op type, calls, total ms) rows, slowest first. Times are the
    operators' own (a PyTorch operator's time excludes the operators it calls), so they add up
    to the time the call spent in operators."""

    rows: tuple[Row, ...]

    @classmethod
    def of(cls, rows: Iterable[Row]) -> OpProfile:
        """From (op type, calls, total ms) rows in any order."""
        return cls(tuple(sorted(rows, key=lambda row: -row[2])))

    @property
    def total_ms(self) -> float:
        return sum(ms for _, _, ms in self.rows)

    def by_class_ms(self) -> dict[str, float]:
        return by_class((op, ms) for op, _, ms in self.rows)

    def csv(self) -> str:
        total = self.total_ms or 1.0
        lines = ["op_type,class,calls,total_ms,share"]
        lines += [
            f"{op},{op_class(op)},{calls},{ms:.4f},{ms / total:.4f}" for op, calls, ms in self.rows
        ]
        return "\n".join(lines) + "\n"

    def metrics(self) -> dict[str, float]:
        """`profile.<class>_ms` for every class that took time, and `profile.total_ms`."""
        per_class = {
            f"profile.{_NOT_A_NAME.sub('_', name)}_ms": ms
            for name, ms in self.by_class_ms().items()
            if ms > 0
        }
        return {**per_class, "profile.total_ms": self.total_ms}


@contextmanager
def _native_logs_silenced() -> Iterator[None]:
    """The process's stderr sent to /dev/null meanwhile: Kineto, under `torch.profiler`, writes
    its own lines there from C++ on every profiled call (`profiler_start`, `profiler_stop`, and
    on CPU-only machines an `ERROR` that no GPU was found), which would read as problems.
    Anything else written to stderr meanwhile (a warning from the model's own call) is lost
    too; the window is one call."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_torch(logits_of, tensors: tuple[torch.Tensor, ...]) -> OpProfile:
    """`PROFILED_RUNS` calls of a PyTorch callable, each under a `torch.profiler` of its own
    (CPU activities); the operators of the call of median length are kept."""
    calls = sorted(
        (_profile_torch_call(logits_of, tensors) for _ in range(PROFILED_RUNS)),
        key=lambda call: call.total_ms,
    )
    return calls[len(calls) // 2]


def _profile_torch_call(logits_of, tensors: tuple[torch.Tensor, ...]) -> OpProfile:
    from torch.profiler import ProfilerActivity, profile

    with (
        _native_logs_silenced(),
        torch.inference_mode(),
        profile(activities=[ProfilerActivity.CPU]) as profiler,
    ):
        logits_of(*tensors)
    return OpProfile.of(
        (event.key, event.count, event.self_cpu_time_total / 1000)
        for event in profiler.key_averages()
        if event.self_cpu_time_total > 0
    )


def profile_onnx(session_of, artifact: Path, tensors: tuple[torch.Tensor, ...]) -> OpProfile:
    """Calls of the ONNX graph in `artifact` in a session of its own with profiling on
    (`session_of(path, profile_prefix)` -> (session, feeds of tensors)): one that warms it,
    then `PROFILED_RUNS`, of which the kernels of the run of median length are counted (one
    run's kernels can be slowed down by anything else running on a shared machine)."""
    with tempfile.TemporaryDirectory() as scratch:
        session, feeds_of = session_of(artifact, str(Path(scratch) / "profile"))
        feeds = feeds_of(tensors)
        for _ in range(1 + PROFILED_RUNS):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    median = sorted(runs[1:], key=lambda run: run["dur"])[len(runs[1:]) // 2]
    start, end = median["ts"], median["ts"] + median["dur"]
    times: dict[str, list[float]] = defaultdict(list)
    for event in events:
        if (
            event.get("cat") == "Node"
            and event.get("name", "").endswith("_kernel_time")
            and start <= event["ts"] <= end
        ):
            times[event["args"]["op_name"]].append(event["dur"] / 1000)
    return OpProfile.of((op, len(ms), sum(ms)) for op, ms in times.items())

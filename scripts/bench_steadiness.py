"""Does the machine reference see the slow spells that move a study's front latencies?

    python scripts/bench_steadiness.py --seconds 360 +experiment=bert_ffn

Rebuilds the front of the study the overrides compose (untrained, as `retime_front.py` does)
and, for `--seconds`, takes windows back to back: a reading of the machine reference
(`tuner.latency.steadiness`), then each front artifact's fastest of `--calls` calls, and so on,
with a reading after the last. A window counts as steady as a round of a measurement does: both
readings around it within `deploy.latency.steady_within` of the floor (the second-fastest
reading; here the run's, where a measurement judges by the floor as it stands). Per point the
table gives its fastest window, the share of all windows within 10% of that, and the same share
among steady and among the other windows, and how the point's windows correlate with the
reference's: a reference that sees the spells makes the steady windows' share high.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tuner.latency import (
    cpu_model,
    fastest_call_ms,
    isa_flags,
    pinned_threads,
    reference_for,
    steady_rounds,
)
from tuner.study import study_front

# A window within this fraction of the point's fastest counts as near it.
_NEAR = 0.10


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=360.0)
    parser.add_argument("--calls", type=int, default=20, help="calls per artifact and window")
    parser.add_argument("overrides", nargs="*", help="the study's Hydra overrides")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.calls < 1:
        parser.error(f"--seconds {args.seconds:g} --calls {args.calls}: both must be positive")
    front = study_front(args.overrides)
    within = front.protocol.steady_within
    if within is None:
        parser.error("deploy.latency.steady_within is null: there is no steadiness to measure")
    reference = reference_for(front.protocol.num_threads)
    with tempfile.TemporaryDirectory(prefix="steadiness-") as workdir:
        rebuilt = front.rebuilder.rebuild(front.targets, Path(workdir))
        labels = list(rebuilt.loaded)
        readings: list[float] = []
        windows: list[list[float]] = []
        with pinned_threads(front.protocol.num_threads), torch.inference_mode():
            reference.reading_ms()  # built and warm
            readings.append(reference.reading_ms())
            ends = time.monotonic() + args.seconds
            while time.monotonic() < ends:
                windows.append(
                    [
                        fastest_call_ms(
                            lambda call=rebuilt.loaded[label]: call(*front.example.tensors),
                            args.calls,
                        )
                        for label in labels
                    ]
                )
                readings.append(reference.reading_ms())
    steady = set(steady_rounds(readings, reference.floor_ms, within))
    # Each window's reference: the slower reading around it, as a round is judged.
    around = np.array([max(readings[i], readings[i + 1]) for i in range(len(windows))])
    print(f"CPU: {cpu_model()}; flags: {isa_flags()}")
    print(
        f"{len(windows)} windows in {args.seconds:g} s; reference fastest {min(readings):.2f} "
        f"ms, median {np.median(readings):.2f}, slowest {max(readings):.2f}; "
        f"{len(steady)} windows steady (both readings within {within:.0%} of the floor, "
        f"{reference.floor_ms:.2f} ms)\n"
    )
    print(
        "| point | fastest window ms | windows within 10% of it: all | steady | other | "
        "correlation with the reference |"
    )
    print("|---|---|---|---|---|---|")
    timings = np.array(windows)
    marks = np.array([i in steady for i in range(len(windows))])
    for column, label in enumerate(labels):
        values = timings[:, column]
        near = values <= values.min() * (1 + _NEAR)
        print(
            f"| {label} | {values.min():.2f} | {near.mean():.0%} | {_share(near, marks)} | "
            f"{_share(near, ~marks)} | {np.corrcoef(around, values)[0, 1]:.2f} |"
        )
    for label, reason in rebuilt.skipped.items():
        print(f"| {label} | not rebuilt: {reason} | - | - | - | - |")


def _share(near: np.ndarray, among: np.ndarray) -> str:
    return f"{near[among].mean():.0%} of {int(among.sum())}" if among.any() else "-"


if __name__ == "__main__":
    main(sys.argv[1:])

"""Re-time the front of a finished study and compare with its latency table.

A latency is kept once per (architecture, backend, protocol, machine) in the study's latency
table, and each front latency rests on `deploy.latency.front_sessions` measurement sessions at
the end of a run. This measures every front point's architecture again, now, in a fresh process
(an untrained model of the same architecture: weights do not change speed), under the study's own
protocol: `--sessions` sessions (default: `deploy.latency.front_sessions` as this command
composes it), `--interval` seconds apart, each with its rounds interleaved across the points.
It prints how far each moved by both choices of `deploy.latency.statistic`: p50 (the median of
the rounds' medians) and the fastest timed call (the steadier on a shared machine,
docs/benchmarks.md "Latency stability"), how far the first session alone moved, and how far
p50 moved against the table's every session (those of too few steady rounds too, which the
table's latency leaves out once a key has steady ones). Its own sessions are judged as a
study's are, each keeping its steady rounds (or the steadiest), and pooled whole:

    python scripts/retime_front.py +experiment=bert_ffn
    python scripts/retime_front.py --sessions 1 +experiment=bert_ffn

Give the overrides the study was run with (storage, experiment, debug profile); the study is
read from `study.storage` under its `study.name`. Nothing is written to the study.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner.latency import LatencyResult, cpu_model, isa_flags, time_rounds
from tuner.latency import messages as latency_messages
from tuner.store import LatencyTable
from tuner.study import Target, study_front

# A move smaller than this counts as holding still (the goal in docs/benchmarks.md).
_WITHIN_PCT = 10.0


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sessions",
        type=int,
        default=None,
        help="measurement sessions pooled into each re-time (default: "
        "deploy.latency.front_sessions)",
    )
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between sessions")
    parser.add_argument("overrides", nargs="*", help="the study's Hydra overrides")
    args = parser.parse_args(argv)
    if args.sessions is not None and args.sessions < 1:
        parser.error(f"--sessions {args.sessions}: at least 1 session")
    front = study_front(args.overrides)
    protocol = front.protocol
    sessions = protocol.front_sessions if args.sessions is None else args.sessions
    timed: list[dict[str, list[list[float]]]] = []
    with tempfile.TemporaryDirectory(prefix="retime-") as workdir:
        rebuilt = front.rebuilder.rebuild(front.targets, Path(workdir))
        for session in range(sessions):
            if session:
                time.sleep(args.interval)
            timed.append(
                time_rounds(
                    rebuilt.loaded,
                    front.example,
                    protocol,
                    on_set_aside=latency_messages.rounds_set_aside,
                ).rounds
            )
    print(f"CPU: {cpu_model()}; flags: {isa_flags()}")
    print(
        f"Study '{front.study.study_name}': {len(front.targets)} front points, re-timed in "
        f"{sessions} session(s) {args.interval:g} s apart, {protocol.rounds} interleaved rounds "
        "each\n"
    )
    _report(front.targets, rebuilt.skipped, front.table, timed)


def _report(
    targets: Sequence[Target],
    skipped: Mapping[str, str],
    table: LatencyTable,
    timed: Sequence[Mapping[str, list[list[float]]]],
) -> None:
    print(
        "| point | table p50 ms (rounds, sessions, spread) | now p50 ms (spread) | moved | "
        "table fastest ms | now fastest ms | moved | first session alone: p50, fastest | "
        "every table session's p50 ms: moved |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    moves: dict[str, list[float]] = {
        "p50": [],
        "fastest call": [],
        "first session's p50": [],
        "first session's fastest call": [],
        "p50 against every table session": [],
    }
    for target in targets:
        before = table.result(target.digest)
        if target.label in skipped or before is None:
            why = skipped.get(target.label, "not in the table")
            print(f"| {target.label} | {why} | - | - | - | - | - | - | - |")
            continue
        now = LatencyResult.of_rounds([r for session in timed for r in session[target.label]])
        first = LatencyResult.of_rounds(timed[0][target.label])
        # The table's latency had it pooled the sessions of too few steady rounds too.
        every = LatencyResult.of_rounds(table.rounds[target.digest or ""])
        moved = {
            "p50": _moved(before.p50_ms, now.p50_ms),
            "fastest call": _moved(before.min_ms, now.min_ms),
            "first session's p50": _moved(before.p50_ms, first.p50_ms),
            "first session's fastest call": _moved(before.min_ms, first.min_ms),
            "p50 against every table session": _moved(every.p50_ms, now.p50_ms),
        }
        for summary, move in moved.items():
            moves[summary].append(abs(move))
        p50, fastest, first_p50, first_fastest, every_p50 = moved.values()
        print(
            f"| {target.label} | {before.p50_ms:.2f} ({before.rounds}, "
            f"{len(table.pooled(target.digest or ''))}, {before.spread_pct:.0f}%) | "
            f"{now.p50_ms:.2f} ({now.spread_pct:.0f}%) | {p50:+.1f}% | "
            f"{before.min_ms:.2f} | {now.min_ms:.2f} | {fastest:+.1f}% | "
            f"{first_p50:+.1f}%, {first_fastest:+.1f}% | {every.p50_ms:.2f}: {every_p50:+.1f}% |"
        )
    for summary, moved in moves.items():
        if moved:
            within = sum(move < _WITHIN_PCT for move in moved)
            print(
                f"\nBy {summary}: {within} of {len(moved)} within {_WITHIN_PCT:g}%; largest move "
                f"{max(moved):.1f}%, median {statistics.median(moved):.1f}%"
            )


def _moved(before: float, now: float) -> float:
    return 100.0 * (now - before) / before


if __name__ == "__main__":
    main(sys.argv[1:])

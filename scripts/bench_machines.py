"""What a measuring worker costs, and what a front per machine changes: the default study run
once, then measured by `python -m tuner.measure` as two more machines on this box, one like the
training machine and one with oneDNN held to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`):

    python scripts/bench_machines.py [--cap AVX2] [-- extra Hydra overrides]

Prints the study's wall time and each measuring worker's (and its share of the study's), then
per machine the front and the report's default recommendation (the fastest front point within
one accuracy point of the best eager fp32 model), and which recommendation changes between the
machines. Every run is in a fresh directory; nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from tuner.front import Constraints, Point, Rule, front_of, recommend
from tuner.latency import cpu_model, isa_flags
from tuner.store import machines_in, stored_settings

SAME_KIND = "same-kind"


def _timed(command: list[str], cwd: str, env: dict[str, str] | None = None) -> float:
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return time.monotonic() - started


def _front(study: optuna.Study, machine: str) -> tuple[list[Point], Point | None]:
    constraints = Constraints.of_settings(stored_settings(study))
    trials = study.get_trials(deepcopy=False)
    record = machines_in(study.user_attrs)[machine]
    points, baseline, _ = front_of(trials, study.user_attrs, constraints, record)
    return points, recommend(points, Rule(), baseline)


def _describe(point: Point | None) -> str:
    if point is None:
        return "none"
    return (
        f"#{point.trial_number} {point.backend} ({point.val_accuracy:.4f}, "
        f"{point.latency_ms:.2f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", default="AVX2", help="ONEDNN_MAX_CPU_ISA of the capped machine")
    parser.add_argument(
        "--keep", type=Path, default=None, metavar="DIR", help="run in DIR and keep the stores"
    )
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    capped = f"onednn-{args.cap.lower()}"
    print(f"CPU: {cpu_model()}; flags {isa_flags()}; {os.cpu_count()} cores")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=False)
    with tempfile.TemporaryDirectory(prefix="bench-machines-") as temporary:
        directory = str(args.keep or temporary)
        storage = f"sqlite:///{directory}/optuna.db"
        stores = [f"study.storage={storage}", f"tracking.uri=sqlite:///{directory}/mlflow.db"]
        study_s = _timed(
            [sys.executable, "-m", "tuner", "+experiment=bert_ffn", *stores, *extra], directory
        )
        measure = [sys.executable, "-m", "tuner.measure", "+experiment=bert_ffn", *stores, *extra]
        measured_s = {
            SAME_KIND: _timed([*measure, f"deploy.machine={SAME_KIND}"], directory),
            capped: _timed(
                [*measure, f"deploy.machine={capped}"],
                directory,
                {"ONEDNN_MAX_CPU_ISA": args.cap},
            ),
        }
        (summary,) = optuna.get_all_study_summaries(storage)
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        machines = machines_in(study.user_attrs)
        trainer = next(name for name in machines if name not in measured_s)
        print(f"\nstudy `{summary.study_name}`: {study_s:.0f} s wall (trained on {trainer})")
        for name, seconds in measured_s.items():
            print(f"measuring worker {name}: {seconds:.0f} s, {100 * seconds / study_s:.0f}% of it")
        fronts = {name: _front(study, name) for name in [trainer, *measured_s]}
        print("\n| machine | points measured | front (trial backend: p50 ms) | recommended |")
        print("| --- | ---: | --- | --- |")
        for name, (points, chosen) in fronts.items():
            front = sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms)
            shown = ", ".join(f"#{p.trial_number} {p.backend}: {p.latency_ms:.2f}" for p in front)
            print(f"| {name} | {len(points)} | {shown} | {_describe(chosen)} |")
        chosen = {name: found[1] for name, found in fronts.items()}
        base = chosen[trainer]
        for name, point in chosen.items():
            if name == trainer:
                continue
            same = (
                point is not None
                and base is not None
                and (point.trial_number, point.backend) == (base.trial_number, base.backend)
            )
            verdict = "the same" if same else f"{_describe(point)} instead of {_describe(base)}"
            print(f"recommendation on {name}: {verdict}")


if __name__ == "__main__":
    main()

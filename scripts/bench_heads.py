"""What attention heads in the search space buy: the default study run with and without
`search_spaces/heads_fraction.yaml`, seed by seed, interleaved (each seed runs both spaces in
turn, so a drift of the machine's speed lands on both), every run in a fresh directory:

    python scripts/bench_heads.py --seeds 0 1 2 --backends eager openvino openvino_int8

For each run: the report's default recommendation (the fastest front point within one accuracy
point of the best eager fp32 model), its architecture, its speed-up over that best model's eager
fp32 point, and the share of its profiled call spent in attention. Then, per space, the median
and range of the recommended latency, and the median and range over seeds of its ratio without
heads to with them (above 1: heads made the recommended point faster). `--backends` narrows
every run to those backends (`deploy.backends`); extra arguments after `--` are Hydra overrides
for every run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from tuner.front import Constraints, Rule, front_of, recommend
from tuner.latency import cpu_model, isa_flags
from tuner.store import stored_settings

REPO = Path(__file__).resolve().parents[1]
SPACES = {"without heads": [], "with heads": ["+search_spaces@search_space=heads_fraction"]}


@dataclass(frozen=True)
class Run:
    space: str
    seed: int
    wall_s: float
    backend: str
    architecture: str
    val_accuracy: float
    latency_ms: float
    speedup: float
    attention_share: float | None


def _run(space: str, seed: int, backends: list[str], extra: list[str]) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-heads-") as directory:
        storage = f"sqlite:///{directory}/optuna.db"
        command = [
            sys.executable,
            "-m",
            "tuner",
            "+experiment=bert_ffn",
            f"study.seed={seed}",
            f"study.storage={storage}",
            f"tracking.uri=sqlite:///{directory}/mlflow.db",
            *SPACES[space],
            *([f"deploy.backends=[{','.join(backends)}]"] if backends else []),
            *extra,
        ]
        started = time.monotonic()
        done = subprocess.run(command, cwd=directory, capture_output=True, text=True)
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        # `bert_ffn`, or with a suffix under a debug profile.
        (summary,) = optuna.get_all_study_summaries(storage)
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        return _summary(space, seed, wall, study)


def _summary(space: str, seed: int, wall: float, study: optuna.Study) -> Run:
    # The front and baseline as the report reads them, under the study's own constraints.
    constraints = Constraints.of_settings(stored_settings(study))
    points, baseline, _ = front_of(study.get_trials(deepcopy=False), study.user_attrs, constraints)
    chosen = recommend(points, Rule(), baseline)
    assert chosen is not None, "no recommendation"
    eager = next(
        p
        for p in points
        if p.trained_in_trial == baseline.trained_in_trial and p.backend == "eager"
    )
    architecture = study.trials[chosen.trial_number].user_attrs.get("architecture", {})
    shown = ", ".join(
        f"{key.removeprefix('model.')} {value}" for key, value in sorted(architecture.items())
    )
    profile = chosen.insight.profile_ms if chosen.insight is not None else {}
    share = profile.get("attention", 0.0) / sum(profile.values()) if profile else None
    return Run(
        space,
        seed,
        wall,
        chosen.backend,
        shown,
        chosen.val_accuracy,
        chosen.latency_ms,
        eager.latency_ms / chosen.latency_ms,
        share,
    )


def _table(runs: list[Run]) -> str:
    lines = [
        "| space | seed | wall s | recommended | architecture | val acc | p50 ms | speed-up vs "
        "best eager fp32 | attention share |",
        "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        share = "-" if run.attention_share is None else f"{100 * run.attention_share:.0f}%"
        lines.append(
            f"| {run.space} | {run.seed} | {run.wall_s:.0f} | {run.backend} | "
            f"{run.architecture} | {run.val_accuracy:.4f} | {run.latency_ms:.2f} | "
            f"{run.speedup:.2f}x | {share} |"
        )
    return "\n".join(lines)


def _spread(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--backends", nargs="*", default=[])
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    print(f"CPU: {cpu_model()}; flags {isa_flags()}; {os.cpu_count()} cores")
    runs = []
    for seed in args.seeds:
        for space in SPACES:
            runs.append(_run(space, seed, args.backends, extra))
            print(_table(runs[-1:]).splitlines()[-1], flush=True)
    print()
    print(_table(runs))
    print()
    by_space = {space: [r for r in runs if r.space == space] for space in SPACES}
    for space, found in by_space.items():
        print(
            f"{space}: recommended p50 {_spread([r.latency_ms for r in found], ' ms')}, "
            f"speed-up {_spread([r.speedup for r in found], 'x')}"
        )
    ratios = [
        without.latency_ms / with_heads.latency_ms
        for without, with_heads in zip(*by_space.values(), strict=True)
    ]
    print(f"recommended latency without heads / with heads, per seed: {_spread(ratios, 'x')}")


if __name__ == "__main__":
    main()

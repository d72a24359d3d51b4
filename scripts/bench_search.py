"""Hypervolume against wall-clock seconds, per sampler, with and without early stopping.

Each configuration runs one small real study (`python -m tuner` in a fresh directory) per seed;
runs are interleaved (seed by seed, every configuration in turn), so a drift of the machine's
speed lands on all of them. Every run's hypervolume is recomputed from its study after the
fact against one common reference point, at each moment a point completed, so the curves are
comparable:

    python scripts/bench_search.py --seeds 0 1 2 --samplers tpe nsga2 gp random \
        --pruning off on --plot docs/img/bench_search.png

Extra arguments after `--` are Hydra overrides for every run (default: the resnet_mixup
experiment on digits, shrunk to seconds per trial). The first configuration is the reference:
the first sampler without early stopping, or, with `--today CHECKOUT`, the first sampler run by
the code of an earlier version (a git worktree of it). The table says when each configuration's
median curve reached the reference's final median hypervolume, as a share of the reference's
median wall time:

    git worktree add /tmp/today <commit>
    python scripts/bench_search.py --seeds 0 --samplers tpe --pruning off on --today /tmp/today \
        -- +experiment=bert_ffn
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna

from tuner.front import Constraints, hypervolume, study_points
from tuner.latency import cpu_model, isa_flags
from tuner.store import stored_settings

STUDY = "bench_search"
DEFAULT_STUDY = [
    "+experiment=resnet_mixup",
    "data=digits",
    "data.max_train_samples=600",
    "data.max_val_samples=300",
    "train.epochs=3",
    "train.cutmix_alpha=0",
    "search_space={deploy.backend:'choice(eager,onnxruntime)'}",
    "deploy.latency.repeats=20",
    "deploy.latency.warmup=3",
    "study.n_trials=12",
]


@dataclass(frozen=True)
class Run:
    sampler: str
    pruning: bool
    seed: int
    wall_seconds: float
    # (seconds since launch, accuracy, latency) of each feasible point, in completion order.
    points: list[tuple[float, float, float]]
    # (seconds since launch, hypervolume) at each completed point.
    curve: list[tuple[float, float]]
    pruned: int

    today: bool = False

    @property
    def label(self) -> str:
        if self.today:
            return f"{self.sampler}, earlier version"
        return f"{self.sampler}{' + early stopping' if self.pruning else ''}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--samplers", nargs="+", default=["tpe", "nsga2", "gp", "random"])
    parser.add_argument("--pruning", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument(
        "--reference-latency",
        type=float,
        default=None,
        help="the common hypervolume reference's latency (ms); default: twice the slowest point "
        "of every run",
    )
    parser.add_argument(
        "--today",
        type=Path,
        default=None,
        help="a checkout of an earlier version: the reference configuration runs its code "
        "(first on PYTHONPATH), so the table compares against what that version did",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep each run's study and tracking store under this folder (one folder per run) "
        "instead of a temporary one, e.g. for scripts/retime_front.py",
    )
    parser.add_argument(
        "--summarise",
        type=Path,
        default=None,
        help="print the table (and plot) of the runs a --json file holds, without running",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write the plot here (PNG)")
    parser.add_argument("--json", type=Path, default=None, help="write every run's curve here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    return parser.parse_args()


def run_study(
    workdir: Path,
    sampler: str,
    pruning: bool,
    seed: int,
    overrides: list[str],
    code: Path | None = None,
):
    command = [
        sys.executable,
        "-m",
        "tuner",
        *(overrides or DEFAULT_STUDY),
        f"study.name={STUDY}",
        f"study.sampler={sampler}",
        f"study.seed={seed}",
        # An earlier version has no early stopping to turn off.
        *([] if code else [f"study.pruning.enabled={str(pruning).lower()}"]),
        f"study.storage=sqlite:///{workdir}/optuna.db",
        f"tracking.uri=sqlite:///{workdir}/mlflow.db",
        f"hydra.run.dir={workdir}/outputs",
    ]
    launched = time.time()
    env = {**os.environ, **({"PYTHONPATH": str(code)} if code else {})}
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.time() - launched
    if result.returncode != 0:
        raise SystemExit(f"study failed ({' '.join(command)}):\n{result.stdout}\n{result.stderr}")
    storage = f"sqlite:///{workdir}/optuna.db"
    # The one study of the run (debug=smoke adds a suffix to its name).
    (name,) = optuna.get_all_study_names(storage)
    return optuna.load_study(study_name=name, storage=storage), launched, wall


@contextmanager
def run_folder(keep: Path | None, name: str) -> Iterator[Path]:
    """A fresh folder for one run: kept under `keep`, or temporary."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
            yield Path(tmp)
        return
    folder = (keep / name).resolve()
    folder.mkdir(parents=True, exist_ok=False)
    yield folder


def completed_points(study: optuna.Study, launched: float) -> list[tuple[float, float, float]]:
    """(seconds since launch, accuracy, latency) of every point feasible under the study's own
    constraints, in completion order. Latencies are the latency table's at the end of the run
    (points of one architecture and backend share one)."""
    settings = stored_settings(study) or {}
    constraints = Constraints(
        settings.get("study.max_accuracy_drop"), settings.get("study.latency_budget_ms")
    )
    finished = {
        t.number: t.datetime_complete.timestamp()
        for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    }
    points = [
        (finished[p.trial_number] - launched, p.val_accuracy, p.latency_ms)
        for p in study_points(study, constraints)
        if p.feasible
    ]
    return sorted(points)


def curve_of(points: list[tuple[float, float, float]], reference: tuple[float, float]):
    return [
        (seconds, hypervolume([(a, lat) for _, a, lat in points[: index + 1]], reference))
        for index, (seconds, _, _) in enumerate(points)
    ]


def value_at(curve: list[tuple[float, float]], seconds: float) -> float:
    reached = [hv for t, hv in curve if t <= seconds]
    return reached[-1] if reached else 0.0


def summarise(runs: list[Run], grid: np.ndarray) -> dict[str, dict]:
    """Per configuration: the median and range of hypervolume over the time grid, final
    hypervolume and wall time."""
    summary: dict[str, dict] = {}
    for label in dict.fromkeys(run.label for run in runs):
        group = [run for run in runs if run.label == label]
        values = np.array([[value_at(run.curve, t) for t in grid] for run in group])
        summary[label] = {
            "median": np.median(values, axis=0),
            "low": values.min(axis=0),
            "high": values.max(axis=0),
            "final": [run.curve[-1][1] if run.curve else 0.0 for run in group],
            "wall": [run.wall_seconds for run in group],
            "pruned": [run.pruned for run in group],
        }
    return summary


def measure(args: argparse.Namespace) -> tuple[list[Run], tuple[float, float]]:
    """Run every configuration for every seed, interleaved; return the runs and the common
    hypervolume reference."""
    configurations = [(s, p == "on", False) for s in args.samplers for p in args.pruning]
    if args.today:
        configurations.insert(0, (args.samplers[0], False, True))
    raw = []
    for seed in args.seeds:
        for sampler, pruning, today in configurations:
            code = args.today.resolve() if today else None
            with run_folder(args.keep, f"{sampler}-{pruning}-{today}-{seed}") as folder:
                study, launched, wall = run_study(
                    folder, sampler, pruning, seed, args.overrides, code
                )
                pruned = len(study.get_trials(states=(optuna.trial.TrialState.PRUNED,)))
                points = completed_points(study, launched)
            raw.append((sampler, pruning, today, seed, wall, points, pruned))
            print(
                f"{sampler} pruning={pruning} earlier version={today} seed={seed}: "
                f"{wall:.0f} s, {pruned} pruned",
                flush=True,
            )
    latency = args.reference_latency or 2.0 * max(lat for *_, pts, _ in raw for _, _, lat in pts)
    reference = (0.0, latency)
    runs = [
        Run(sampler, pruning, seed, wall, points, curve_of(points, reference), pruned, today)
        for sampler, pruning, today, seed, wall, points, pruned in raw
    ]
    return runs, reference


def _reached(grid: np.ndarray, curve: np.ndarray, target: float) -> float | None:
    return next((t for t, hv in zip(grid, curve, strict=True) if hv >= target), None)


def report(runs: list[Run], reference: tuple[float, float], plot: Path | None) -> None:
    """The table (and the plot) of `runs`, against the first run's configuration."""
    grid = np.linspace(0.0, max(run.wall_seconds for run in runs), 400)
    summary = summarise(runs, grid)
    baseline_label = runs[0].label
    baseline = summary[baseline_label]
    target = float(np.median(baseline["final"]))
    baseline_wall = float(np.median(baseline["wall"]))
    seeds = sorted({run.seed for run in runs})

    print(f"\nCPU: {cpu_model()}; flags: {isa_flags()}")
    print(f"Reference point: accuracy 0, latency {reference[1]:.3g} ms; seeds {seeds}")
    print(
        f"Target: {baseline_label}'s final median hypervolume {target:.4g}; its median wall "
        f"time {baseline_wall:.0f} s\n"
    )
    print(
        "| configuration | final hypervolume, median [min-max] | wall s, median [min-max] "
        "| pruned trials | reaches the target at (share of the reference's wall time) "
        "| reaches 99% of it at |"
    )
    print("|---|---|---|---|---|---|")

    def when(reached: float | None) -> str:
        return "never" if reached is None else f"{reached:.0f} s ({reached / baseline_wall:.0%})"

    for label, row in summary.items():
        print(
            f"| {label} | {np.median(row['final']):.4g} [{min(row['final']):.4g}-"
            f"{max(row['final']):.4g}] | {np.median(row['wall']):.0f} [{min(row['wall']):.0f}-"
            f"{max(row['wall']):.0f}] | {sum(row['pruned'])} "
            f"| {when(_reached(grid, row['median'], target))} "
            f"| {when(_reached(grid, row['median'], 0.99 * target))} |"
        )
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(8, 5))
        for label, row in summary.items():
            (line,) = axes.plot(grid, row["median"], label=label)
            axes.fill_between(grid, row["low"], row["high"], color=line.get_color(), alpha=0.15)
        axes.axhline(target, color="grey", linestyle=":", label=f"target ({baseline_label} final)")
        axes.set_xlabel("wall-clock seconds since launch")
        axes.set_ylabel("hypervolume (accuracy x ms)")
        axes.set_title(f"Hypervolume over time: median and range of {len(seeds)} seed(s)")
        axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(plot, dpi=120)


def main() -> None:
    args = parse_args()
    if args.summarise:
        written = json.loads(args.summarise.read_text())
        fields = set(Run.__dataclass_fields__)
        runs = [Run(**{k: v for k, v in run.items() if k in fields}) for run in written["runs"]]
        reference = tuple(written["reference"])
    else:
        runs, reference = measure(args)
    report(runs, reference, args.plot)
    if args.json:
        runs_written = [run.__dict__ | {"label": run.label} for run in runs]
        args.json.write_text(json.dumps({"reference": reference, "runs": runs_written}))


if __name__ == "__main__":
    main()

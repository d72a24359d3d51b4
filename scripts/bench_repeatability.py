"""How far a backend's latency moves when the same artifact is timed again in a fresh process.

    python scripts/bench_repeatability.py --ffn-width 1024 --num-layers 4 \
        --backends eager onnxruntime onnxruntime_int8 onnxruntime_fused_int8 \
        --variants onnx.allow_spinning=true onnx.allow_spinning=false --measurements 12

MiniLM-L6, cut to --ffn-width (and --num-layers), is converted once per backend and `deploy`
variant (untrained: weights do not change how fast a graph runs). Each measurement is then a
fresh process that loads every backend's artifact with its variant's settings and times them
as a study does (interleaved rounds, the study's protocol; its latency the median of the round
medians); the variants take turns, in alternating order, so a slow spell of the machine lands
on all of them. Per variant and backend the table gives the median latency over the
measurements, their range, and how many pairs of measurements (earlier, later) are within 10%
of each other: the chance that re-timing a point later moves it by less than 10%.

With `--statistics`, each measurement's rounds are also summarised by other statistics than p50
(the median of the round medians), to see which one a slow spell of the machine moves least;
`--interval` spaces the measurements out, so the table covers the machine's drift over
minutes rather than seconds:

    python scripts/bench_repeatability.py --ffn-width 1280 --num-layers 4 \
        --backends eager onnxruntime_int8 onnxruntime_fused_int8 \
        --statistics p50 p10 min --measurements 12 --interval 60
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from tuner.config import SearchSpace, compose_config
from tuner.console import quiet_libraries
from tuner.data import load_splits
from tuner.deploy import BACKENDS, convert
from tuner.edits import apply_edits
from tuner.latency import (
    LATENCY_STATISTICS,
    LatencyProtocol,
    LatencyResult,
    cpu_model,
    isa_flags,
    time_rounds,
)
from tuner.models import ModelRecipe, build_model
from tuner.study import calibration_inputs, modality_for

# A later measurement within this fraction of an earlier one counts as "the same latency".
WITHIN = 0.10

# How one measurement's rounds are summarised into one latency: the choices of a study's
# `deploy.latency.statistic`, and two more to compare them with.
STATISTICS = {
    **{name: LATENCY_STATISTICS.get(name) for name in LATENCY_STATISTICS},
    "p10": lambda result: float(np.percentile(result.samples_ms, 10)),
    "fastest_round": lambda result: result.fastest_round_ms,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ffn-width", type=int, default=1024)
    parser.add_argument("--num-layers", type=int, help="encoder layers kept (default: all six)")
    parser.add_argument(
        "--backends", nargs="+", default=["eager", "onnxruntime", "onnxruntime_int8"]
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[""],
        help="deploy overrides (KEY=VALUE under deploy), each measured on its own",
    )
    parser.add_argument("--measurements", type=int, default=6, help="fresh processes per variant")
    parser.add_argument(
        "--interval", type=float, default=0.0, help="seconds to wait between measurements"
    )
    parser.add_argument(
        "--statistics",
        nargs="+",
        choices=sorted(STATISTICS),
        default=["p50"],
        help="summaries of a measurement's timed calls to compare (p50 and min: a study's choices)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per round")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--variant-index", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def config(args: argparse.Namespace) -> DictConfig:
    return compose_config(
        [
            "data.max_train_samples=300",
            "data.max_val_samples=64",
            f"deploy.latency.num_threads={args.threads}",
            f"deploy.latency.repeats={args.repeats * args.rounds}",
            f"deploy.latency.rounds={args.rounds}",
            f"deploy.latency.max_rounds={args.rounds}",
        ]
    )


def deploy_of(cfg: DictConfig, variant: str) -> DictConfig:
    return OmegaConf.merge(cfg.deploy, OmegaConf.from_dotlist([variant] if variant else []))


def convert_all(args: argparse.Namespace, cfg: DictConfig, workdir: Path) -> None:
    """Every (variant, backend) artifact, and what a measurement needs to load and time them."""
    splits = load_splits(cfg.data)
    modality = modality_for(cfg, SearchSpace(), splits)
    torch.manual_seed(0)
    model = build_model(cfg.model, splits.num_labels).eval()
    depth = {} if args.num_layers is None else {"num_layers": args.num_layers}
    model_cfg = OmegaConf.merge(cfg.model, {"ffn_width": args.ffn_width, **depth})
    apply_edits(model, model_cfg)
    recipe = ModelRecipe.of(model_cfg, splits.num_labels)
    protocol = LatencyProtocol.from_config(cfg.deploy.latency)
    example = modality.example(splits.val.items, protocol)
    train = modality.encode(splits.train.items, splits.train.labels)
    calibration = calibration_inputs(train, int(cfg.deploy.calibration_samples))
    artifacts: dict[int, dict[str, str]] = {}
    for index, variant in enumerate(args.variants):
        artifacts[index] = {}
        for name in args.backends:
            converted = convert(
                name,
                model,
                recipe,
                example,
                deploy_of(cfg, variant),
                workdir / str(index) / name,
                calibration,
            )
            artifacts[index][name] = str(converted.artifact)
            print(f"converted {name} {variant}".rstrip(), file=sys.stderr)
    with (workdir / "measurement.pkl").open("wb") as file:
        pickle.dump({"artifacts": artifacts, "example": example}, file)


def measure(args: argparse.Namespace) -> None:
    """One measurement, in this fresh process: rounds of milliseconds per backend, as JSON."""
    cfg = config(args)
    deploy = deploy_of(cfg, args.variants[args.variant_index])
    with (args.measure / "measurement.pkl").open("rb") as file:
        saved = pickle.load(file)
    callables = {
        name: BACKENDS.get(name).load(Path(artifact), deploy)
        for name, artifact in saved["artifacts"][args.variant_index].items()
    }
    protocol = LatencyProtocol.from_config(deploy.latency)
    rounds = time_rounds(callables, saved["example"], protocol).rounds
    print(json.dumps(rounds))


def measured(args: argparse.Namespace, workdir: Path, index: int) -> dict[str, list[list[float]]]:
    command = [sys.executable, __file__, *sys.argv[1:], "--measure", str(workdir)]
    done = subprocess.run(
        [*command, "--variant-index", str(index)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    args = parse_args()
    quiet_libraries()
    if args.measure is not None:
        measure(args)
        return 0
    cfg = config(args)
    # variant -> (backend, statistic) -> one latency per measurement
    latencies: dict[int, dict[tuple[str, str], list[float]]] = {
        index: {(name, stat): [] for name in args.backends for stat in args.statistics}
        for index in range(len(args.variants))
    }
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        convert_all(args, cfg, workdir)
        for measurement in range(args.measurements):
            if measurement and args.interval:
                time.sleep(args.interval)
            order = list(range(len(args.variants)))
            for index in order if measurement % 2 == 0 else order[::-1]:
                rounds = measured(args, workdir, index)
                for name, timed in rounds.items():
                    result = LatencyResult.of_rounds(timed)
                    for stat in args.statistics:
                        latencies[index][name, stat].append(STATISTICS[stat](result))
                now = time.strftime("%H:%M:%S")
                latest = ", ".join(
                    f"{n} {stat} {values[-1]:.2f}" for (n, stat), values in latencies[index].items()
                )
                print(f"{now} {args.variants[index] or 'as shipped'}: {latest}", file=sys.stderr)
    layers = "all six" if args.num_layers is None else str(args.num_layers)
    print(
        f"\nMiniLM-L6 at FFN {args.ffn_width}, {layers} layers; {args.measurements} fresh-process "
        f"measurements per variant, {args.interval:g} s apart, each {args.rounds} interleaved "
        f"rounds x {args.repeats} calls, {args.threads} threads; {cpu_model()}, "
        f"torch {torch.__version__}"
    )
    print(f"CPU flags: {isa_flags()}\n")
    print(
        "| variant | backend | statistic | median ms | range | later within 10% of earlier | "
        "largest move |"
    )
    print("| --- | --- | --- | ---: | --- | ---: | ---: |")
    for index, variant in enumerate(args.variants):
        for (name, stat), values in latencies[index].items():
            moves = [abs(b - a) / a for i, a in enumerate(values) for b in values[i + 1 :]]
            within = sum(move < WITHIN for move in moves)
            print(
                f"| {variant or 'as shipped'} | {name} | {stat} | "
                f"{statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f} | "
                f"{within}/{len(moves)} | {max(moves, default=0.0):.1%} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

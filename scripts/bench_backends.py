"""Latency, size and agreement of every backend for a real model, timed in interleaved rounds.

    python scripts/bench_backends.py --ffn-width 1024
    python scripts/bench_backends.py --study bert_ffn --storage sqlite:///optuna.db
    python scripts/bench_backends.py --model resnet --width-multiplier 0.5 --depth 2
    python scripts/bench_backends.py --model resnet --data digits --train-samples 300
    python scripts/bench_backends.py --model resnet --backends onnxruntime_int8_static \
        --variants onnx.int8.reduce_range=true onnx.int8.weight_type=uint8

--model minilm (the default): the packaged MiniLM-L6 gets a short fine-tune on Rotten Tomatoes
(so agreement is measured on a real classifier), then its FFNs are cut to --ffn-width (and its
encoder to --num-layers), and it is
converted for each backend; the baseline is eager fp32 at full width. --model resnet: timm's
ResNet-18 at --width-multiplier and --depth is trained from scratch on Fashion-MNIST (or
--data digits), and converted for each backend; the baseline is the trained model itself, eager
fp32 in memory. Models, data, training and deployment are composed from conf/ as
`python -m tuner model=... data=...` would compose them, and the backends default to every
registered one that takes the data's modality. --variants adds, for each backend, a row per
`deploy` override (`onnx.int8.reduce_range=true`, `onnx.int8.per_channel=false`, ...), so that
settings of one backend are compared in the same interleaved rounds.

Timing goes round-robin over the backends and the baseline, for --rounds rounds, so a slow
spell on a shared CPU hits every backend alike; as in a study, p50 is the median of the
per-round medians, p95 pools all timed calls, and "spread" is the range of the per-round
medians. "convert s" is each row's conversion as a study makes it: the ONNX Runtime backends of
one variant share the exported and fused graphs they start from, so a row after the first to
export (or fuse) takes only its own steps. With --study, the study's front is compared with the
baseline measured here.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
import torch
from omegaconf import DictConfig, OmegaConf

from tuner.config import SearchSpace, compose_config
from tuner.console import quiet_libraries
from tuner.data import load_splits
from tuner.deploy import BACKENDS, check_outputs, convert, graph_of, profile_of, reference_of
from tuner.edits import apply_edits
from tuner.errors import ConfigError
from tuner.front import baseline_of, study_points
from tuner.insight import OP_CLASSES, MachinePeak, roofline
from tuner.latency import (
    LatencyProtocol,
    LatencyResult,
    cpu_model,
    flops_per_call,
    isa_flags,
    measure_peak,
    time_rounds,
)
from tuner.models import ModelRecipe, build_model
from tuner.study import calibration_inputs, check_backends, modality_for
from tuner.training import batch_loss, collect_logits, initialise_new_layers, train

# conf/data files each model may read; the first is the default.
DATA = {"minilm": ("rotten_tomatoes",), "resnet": ("fashion_mnist", "digits")}
# The row every backend's speed-up is measured against (it is only timed).
BASELINES = {"minilm": "eager fp32, full width", "resnet": "eager fp32, in memory"}
# Under each model's --lr default of None: fine-tuning keeps conf/train's rate; a CNN trained
# from scratch takes one from the range of search_spaces/lr_from_scratch.yaml.
LR = {"minilm": None, "resnet": 1e-3}
# Each data file's (name, what one example is), for the table's caption.
EXAMPLES = {
    "rotten_tomatoes": ("Rotten Tomatoes", "snippets"),
    "fashion_mnist": ("Fashion-MNIST", "images"),
    "digits": ("digits", "images"),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(DATA), default="minilm")
    parser.add_argument(
        "--data",
        choices=sorted({name for names in DATA.values() for name in names}),
        help="conf/data file (default: rotten_tomatoes for minilm, fashion_mnist for resnet)",
    )
    parser.add_argument("--ffn-width", type=int, default=1024, help="minilm: FFN width cut to")
    parser.add_argument(
        "--num-layers", type=int, help="minilm: encoder layers kept (default: all six)"
    )
    parser.add_argument("--width-multiplier", type=float, default=0.5, help="resnet: channels")
    parser.add_argument("--depth", type=int, default=2, help="resnet: blocks per stage")
    parser.add_argument(
        "--backends",
        nargs="+",
        help="default: every registered backend that takes the data's modality",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[],
        help="deploy overrides (KEY=VALUE under deploy), each timed as a row of its own",
    )
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128, help="minilm: tokens per example")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warmup", type=int, default=10, help="untimed calls per backend before the first round"
    )
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per round")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, help="default: 5e-5 for minilm, 1e-3 for resnet")
    parser.add_argument("--train-samples", type=int, default=1000)
    parser.add_argument("--val-samples", type=int, default=400)
    parser.add_argument("--study", help="also compare this study's front with the baseline")
    parser.add_argument("--storage", default="sqlite:///optuna.db")
    parser.add_argument("--max-accuracy-drop", type=float, default=0.01)
    args = parser.parse_args()
    args.data = args.data or DATA[args.model][0]
    if args.data not in DATA[args.model]:
        parser.error(f"--model {args.model} reads --data {' or '.join(DATA[args.model])}")
    return args


def config_overrides(args: argparse.Namespace) -> list[str]:
    """The command-line overrides of `python -m tuner` that set up this benchmark."""
    overrides = [
        f"model={args.model}",
        f"data={args.data}",
        f"data.max_train_samples={args.train_samples}",
        f"data.max_val_samples={args.val_samples}",
        f"train.epochs={args.epochs}",
        f"deploy.latency.batch_size={args.batch_size}",
        f"deploy.latency.seq_len={args.seq_len}",
        f"deploy.latency.num_threads={args.threads}",
        f"deploy.latency.warmup={args.warmup}",
        f"deploy.latency.repeats={args.repeats * args.rounds}",
        f"deploy.latency.rounds={args.rounds}",
        f"deploy.latency.max_rounds={args.rounds}",
    ]
    lr = args.lr if args.lr is not None else LR[args.model]
    if lr is not None:
        overrides.append(f"train.lr={lr}")
    if args.model == "resnet":
        overrides += [
            f"model.width_multiplier={args.width_multiplier}",
            f"model.depth={args.depth}",
        ]
    return overrides


def edits(args: argparse.Namespace) -> dict:
    """The structural edits applied after training (`tuner.edits`, by their `model` keys)."""
    if args.model != "minilm":
        return {}
    depth = {} if args.num_layers is None else {"num_layers": args.num_layers}
    return {"ffn_width": args.ffn_width, **depth}


def default_backends(modality: str) -> list[str]:
    """Every registered CPU backend that deploys models of `modality`."""
    return [
        name
        for name in BACKENDS.names()
        if modality in BACKENDS.get(name).modalities and BACKENDS.get(name).device == "cpu"
    ]


def trained_model(cfg: DictConfig, num_labels: int, modality: str, train_data, val_data):
    """The configured model, built, initialised and trained as a trial does it."""
    seed = int(cfg.train.seed)
    torch.manual_seed(seed)
    model = build_model(cfg.model, num_labels)
    torch.manual_seed(seed)
    initialise_new_layers(model.new_layers(), str(cfg.train.init))
    train(model, train_data, val_data, cfg.train, batch_loss(modality, cfg.train, num_labels))
    return model.eval()


def title(args: argparse.Namespace, cfg: DictConfig, n_train: int, example) -> str:
    examples = f"{n_train} {' '.join(EXAMPLES[args.data])}"
    if args.model == "minilm":
        layers = "" if args.num_layers is None else f", {args.num_layers} layers"
        what = f"MiniLM-L6 fine-tuned on {examples}, FFN {args.ffn_width}{layers}"
        shape = f"seq {args.seq_len}"
    else:
        epochs = f"{args.epochs} epoch{'s' if args.epochs != 1 else ''}"
        what = (
            f"timm {cfg.model.name} at width x{args.width_multiplier}, depth {args.depth}, "
            f"trained from scratch for {epochs} on {examples}"
        )
        shape = f"input {example.shape()}"
    return (
        f"{what}; batch {args.batch_size}, {shape}, {args.threads} threads, "
        f"{args.rounds} rounds x {args.repeats} calls; {cpu_model()}, torch {torch.__version__}"
    )


def main() -> int:
    args = parse_args()
    quiet_libraries()
    torch.set_num_threads(args.threads)
    try:
        return bench(args)
    except ConfigError as exc:  # e.g. the data's files are missing
        print(exc, file=sys.stderr)
        return 2


def bench(args: argparse.Namespace) -> int:
    cfg = compose_config(config_overrides(args))
    splits = load_splits(cfg.data)
    modality = modality_for(cfg, SearchSpace(), splits)
    backends = args.backends or default_backends(modality.name)
    check_backends(backends, modality.name, cfg.deploy, {})
    train_data = modality.encode(splits.train.items, splits.train.labels)
    val = modality.encode(splits.val.items, splits.val.labels)
    print(
        f"Training {args.model} on {len(train_data)} {' '.join(EXAMPLES[args.data])} ...",
        file=sys.stderr,
    )
    baseline = trained_model(cfg, splits.num_labels, modality.name, train_data, val)
    # Backends convert an edited copy; the baseline is only timed.
    edited = copy.deepcopy(baseline)
    edited_cfg = OmegaConf.merge(cfg.model, edits(args))
    apply_edits(edited, edited_cfg)
    recipe = ModelRecipe.of(edited_cfg, splits.num_labels)
    reference = reference_of(edited, val)
    protocol = LatencyProtocol.from_config(cfg.deploy.latency)
    example = modality.example(splits.val.items, protocol)
    # What static int8 backends calibrate on, as in a study.
    calibration = calibration_inputs(train_data, int(cfg.deploy.calibration_samples))

    baseline_name = BASELINES[args.model]
    rows: dict[str, dict] = {baseline_name: {"logits_of": baseline, "size_mb": float("nan")}}
    with tempfile.TemporaryDirectory() as workdir:
        for index, (name, variant) in enumerate(rows_to_convert(backends, args.variants)):
            row = f"{name} {variant}" if variant else name
            deploy = OmegaConf.merge(
                cfg.deploy, OmegaConf.from_dotlist([variant] if variant else [])
            )
            # As in a study, the backends converting one model under one `deploy` config share
            # the graphs they start from (the first to need an export or fusion makes it).
            shared = Path(workdir) / "shared" / (variant or "as shipped")
            try:
                workdir_of = Path(workdir) / str(index)
                converted = convert(
                    name, edited, recipe, example, deploy, workdir_of, calibration, shared
                )
                checks = check_outputs(collect_logits(converted.logits_of, val), reference)
            except Exception as exc:  # an unavailable or failing backend is reported, not fatal
                print(f"{row}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            rows[row] = {
                "logits_of": converted.logits_of,
                "size_mb": converted.size_mb,
                "convert_s": converted.seconds,
                "notes": converted.notes,
                "artifact": converted.artifact,
                **checks,
            }
            print(f"converted {row} in {converted.seconds:.1f} s", file=sys.stderr)
        # The study's own protocol: interleaved rounds, p50 the median of the round medians,
        # the rounds judged for steadiness as a study's are.
        timings = time_rounds(
            {name: row["logits_of"] for name, row in rows.items()},
            example,
            protocol,
            on_set_aside=lambda aside, timed: print(
                f"{aside} of {timed} timed rounds set aside (deploy.latency.steady_within)",
                file=sys.stderr,
            ),
        ).rounds
        # What a study adds to every point after its timed calls, and what it finds.
        insight = {
            name: inspect(name.split()[0], row, example, cfg.deploy)
            for name, row in rows.items()
            if "artifact" in row
        }
        # And once per study and trained model: the machine's peaks, the model's FLOPs.
        started = time.perf_counter()
        peak = measure_peak(protocol.num_threads)
        counted = time.perf_counter()
        flops = flops_per_call(edited, example.tensors)
        roofs = Roofs(peak, flops, counted - started, time.perf_counter() - counted)
    latencies = {name: LatencyResult.of_rounds(rounds) for name, rounds in timings.items()}
    baseline_p50 = latencies[baseline_name].p50_ms
    print(f"\n{title(args, cfg, len(train_data), example)}")
    print(f"CPU flags: {isa_flags()}")
    against = "of the same edits" if args.model == "minilm" else "of the same model"
    print(
        f"Agreement and accuracy on {len(val)} validation {EXAMPLES[args.data][1]}, "
        f"against eager fp32 {against}.\n"
    )
    print(
        f"| backend | p50 ms | p95 ms | spread of round medians | speed-up vs "
        f"{baseline_name.replace(',', '')} | size MB | agreement | max logit diff | val acc | "
        "convert s |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in rows.items():
        medians = [statistics.median(r) for r in timings[name]]
        p50, p95 = latencies[name].p50_ms, latencies[name].p95_ms
        print(
            f"| {name} | {p50:.2f} | {p95:.2f} | {min(medians):.2f}-{max(medians):.2f} | "
            f"{baseline_p50 / p50:.2f}x | {_cell(row, 'size_mb', '.1f')} | "
            f"{_cell(row, 'agreement', '.1%')} | {_cell(row, 'max_logit_diff', '.3g')} | "
            f"{_cell(row, 'val_accuracy', '.3f')} | {_cell(row, 'convert_s', '.1f')} |"
        )
    described = {name: row["notes"] for name, row in rows.items() if row.get("notes")}
    if described:
        print("\nWhat the artifacts hold:\n")
        for name, notes in described.items():
            print(f"- {name}: {describe(notes)}")
    print_insight(insight, latencies, rows, roofs)
    if args.study:
        compare_front(args, baseline_name, latencies[baseline_name])
    return 0


def inspect(backend_name: str, row: dict, example, deploy: DictConfig) -> dict:
    """The point's graph dump and one profiled call, as a study records them, and the seconds
    they took."""
    backend = BACKENDS.get(backend_name)
    started = time.perf_counter()
    graph, _ = graph_of(backend, row["artifact"], row["logits_of"], example)
    profile, no_profile = profile_of(backend, row["artifact"], row["logits_of"], example, deploy)
    if profile is None:  # every CPU backend takes a profile; this benchmark times CPU ones
        raise RuntimeError(no_profile)
    return {"seconds": time.perf_counter() - started, "graph": graph, "profile": profile}


@dataclass(frozen=True)
class Roofs:
    """The machine's peaks and the edited model's FLOPs per call, and the seconds each took."""

    peak: MachinePeak
    flops: float
    peak_seconds: float
    flops_seconds: float


def print_insight(
    insight: dict[str, dict],
    latencies: dict[str, LatencyResult],
    rows: dict[str, dict],
    roofs: Roofs,
) -> None:
    """Where one call's time goes per backend (ms by op class, share), its layout ops, its
    roofline fraction, and what reading the graph and profiling cost."""
    gemm = ", ".join(f"{name} {value:.0f}" for name, value in roofs.peak.gemm_gflops.items())
    print(
        f"\nMachine peaks ({roofs.peak.threads} threads): GEMM G(FL)OP/s {gemm}; bandwidth "
        f"{roofs.peak.bandwidth_gbs:.1f} GB/s (measured in {roofs.peak_seconds:.1f} s, once "
        f"per study). Model: {roofs.flops / 1e9:.2f} GFLOP per call (counted in "
        f"{roofs.flops_seconds:.2f} s, once per trained model)."
    )
    print("\nOne profiled call per backend, after the timed rounds (ms by op class, share):\n")
    print(
        "| backend | p50 ms | profiled ms | "
        + " | ".join(OP_CLASSES)
        + " | layout ops | roofline | graph + profile s |"
    )
    print("| --- |" + " ---: |" * (len(OP_CLASSES) + 5))
    for name, found in insight.items():
        profile = found["profile"]
        total = profile.total_ms or 1.0
        classes = " | ".join(
            f"{ms:.2f} ({ms / total:.0%})" if ms else "-" for ms in profile.by_class_ms().values()
        )
        layout = "-" if found["graph"] is None else str(found["graph"].layout_ops)
        # A backend whose arithmetic follows a setting says which it took (`openvino`).
        precision = (
            rows[name].get("notes", {}).get("precision", BACKENDS.get(name.split()[0]).precision)
        )
        line = roofline(
            roofs.flops, rows[name]["size_mb"] * 1e6, latencies[name].p50_ms, precision, roofs.peak
        )
        print(
            f"| {name} | {latencies[name].p50_ms:.2f} | {profile.total_ms:.2f} | {classes} | "
            f"{layout} | {'-' if line is None else line.describe(precision)} | "
            f"{found['seconds']:.2f} |"
        )


def describe(notes: dict) -> str:
    """A backend's notes in a line: fused operators, merged attention projections, nodes kept
    in fp32, OpenVINO's precision and the layers it keeps out of int8."""
    parts = []
    if "fused_ops" in notes:
        fused = notes["fused_ops"]
        parts.append(" ".join(f"{op} x{n}" for op, n in fused.items()) or "nothing fused")
    if notes.get("attention_fused") is False:
        parts.append("attention NOT fused")
    if "merged_attention" in notes:
        parts.append(f"query, key and value merged in {notes['merged_attention']} attention layers")
    if "fp32_nodes" in notes:
        kept = notes["fp32_nodes"]
        parts.append(
            f"{len(kept)} of {len(kept) + notes['int8_nodes']} quantisable nodes kept in fp32 "
            f"({', '.join(kept) or 'none'}), agreement on training inputs "
            f"{notes['train_agreement']:.1%}"
        )
    if "inference_precision" in notes:
        parts.append(f"compiled in {notes['inference_precision']}")
    if "int8_layers" in notes:
        higher = notes["higher_precision_layers"]
        parts.append(
            f"{notes['int8_layers']} weighted layers in int8, {len(higher)} in higher precision"
        )
    if "held_aside_agreement" in notes:
        parts.append(
            f"agreement on {notes['held_aside_examples']} held-aside training inputs "
            f"{notes['held_aside_agreement']:.1%}"
        )
    return "; ".join(parts)


# `deploy` nodes read by one family of backends only (by the prefix of their names): a variant
# of such a setting makes rows for that family's backends only.
FAMILY_SETTINGS = {"onnx": "onnxruntime", "openvino": "openvino"}


def rows_to_convert(backends: list[str], variants: list[str]) -> list[tuple[str, str]]:
    """(backend, deploy override) per table row: each backend as configured, then each
    variant of it that it reads."""

    def reads(name: str, variant: str) -> bool:
        family = FAMILY_SETTINGS.get(variant.split(".", 1)[0])
        return family is None or name.startswith(family)

    return [
        (name, variant)
        for name in backends
        for variant in ["", *variants]
        if not variant or reads(name, variant)
    ]


def _cell(row: dict, key: str, spec: str) -> str:
    """A table cell; the baseline is only timed, so it has no other figures."""
    value = row.get(key, float("nan"))
    return "-" if math.isnan(value) else format(value, spec)


def compare_front(
    args: argparse.Namespace, baseline_name: str, baseline_latency: LatencyResult
) -> None:
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    points = study_points(study)
    # The study's own baseline, as its constraints, console and report read it.
    best = baseline_of(study.get_trials(deepcopy=False)).accuracy
    if math.isnan(best):
        print(f"\nStudy {args.study} has no trained model to compare with.")
        return
    close = [p for p in points if p.val_accuracy >= best - args.max_accuracy_drop]
    fastest = min(close, key=lambda p: p.latency_ms)
    # The baseline by the statistic the study ranks by, so the two figures are alike.
    statistic = fastest.latency_statistic
    baseline_ms = baseline_latency.ranked_ms(statistic)
    # The point's backend and structure (its `model.*` params, e.g. FFN width and depth).
    params = sorted((k, v) for k, v in fastest.params.items() if k.startswith("model."))
    what = ", ".join([fastest.backend, *(f"{key}={value}" for key, value in params)])
    print(
        f"\nStudy {args.study}: best eager fp32 val_accuracy {best:.4f}. Fastest point within "
        f"{args.max_accuracy_drop:.2f} of it: trial {fastest.trial_number} ({what}), "
        f"val_accuracy {fastest.val_accuracy:.4f}, {statistic} {fastest.latency_ms:.2f} ms = "
        f"{baseline_ms / fastest.latency_ms:.2f}x faster than {baseline_name} "
        f"({baseline_ms:.2f} ms here)."
    )


if __name__ == "__main__":
    sys.exit(main())

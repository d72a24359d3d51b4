"""Latency, size and agreement of every backend for a real model, timed in interleaved rounds.

    python scripts/bench_backends.py --ffn-width 1024
    python scripts/bench_backends.py --study bert_ffn --storage sqlite:///optuna.db

The packaged MiniLM-L6 gets a short fine-tune on Rotten Tomatoes (so agreement is measured on a
real classifier), then its FFNs are cut to --ffn-width, and it is converted for each backend.
Timing goes round-robin over the backends, and eager fp32 at full width, for --rounds rounds, so
a slow spell on a shared CPU hits every backend alike; p50 and p95 pool all timed calls, and
"spread" is the range of the per-round medians. With --study, the study's front is compared with
the full-width eager baseline measured here.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import optuna
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from tuner.backends import BACKENDS
from tuner.config import CONF_DIR
from tuner.console import quiet_libraries
from tuner.data import load_splits
from tuner.data.tokens import tokenize
from tuner.deploy import check_outputs, convert, reference_of
from tuner.edits.ffn_width import shrink_ffn
from tuner.front import study_points
from tuner.latency import LatencyProtocol, cpu_model, example_inputs, measure_latency
from tuner.models import build_model, resolve_name_or_path
from tuner.recipe import ModelRecipe
from tuner.training import collect_logits, initialise_new_layers, train

BASELINE = "eager fp32, full width"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ffn-width", type=int, default=1024)
    parser.add_argument("--backends", nargs="+", default=BACKENDS.names())
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per round")
    parser.add_argument("--train-samples", type=int, default=1000)
    parser.add_argument("--val-samples", type=int, default=400)
    parser.add_argument("--study", help="also compare this study's front with the baseline")
    parser.add_argument("--storage", default="sqlite:///optuna.db")
    parser.add_argument("--max-accuracy-drop", type=float, default=0.01)
    return parser.parse_args()


def fine_tuned_minilm(args: argparse.Namespace):
    cfg = OmegaConf.merge(
        OmegaConf.load(CONF_DIR / "data" / "rotten_tomatoes.yaml"),
        {"max_train_samples": args.train_samples, "max_val_samples": args.val_samples},
    )
    splits = load_splits(cfg)
    model_cfg = OmegaConf.load(CONF_DIR / "model" / "minilm.yaml")
    tokenizer = AutoTokenizer.from_pretrained(resolve_name_or_path(model_cfg.name_or_path))
    torch.manual_seed(0)
    model = build_model(model_cfg, splits.num_labels)
    initialise_new_layers(model.new_layers(), "auto")
    train_cfg = OmegaConf.load(CONF_DIR / "train" / "default.yaml")
    train_cfg.epochs = 1
    val = tokenize(tokenizer, splits.val, 64)
    train(model, tokenize(tokenizer, splits.train, 64), val, train_cfg)
    return model.eval(), model_cfg, tokenizer, splits, val


def main() -> int:
    args = parse_args()
    quiet_libraries()
    torch.set_num_threads(args.threads)
    print(f"Fine-tuning MiniLM-L6 on {args.train_samples} snippets ...", file=sys.stderr)
    full, model_cfg, tokenizer, splits, val = fine_tuned_minilm(args)
    edited = copy.deepcopy(full)
    shrink_ffn(edited, args.ffn_width)
    recipe = ModelRecipe.of(
        OmegaConf.merge(model_cfg, {"ffn_width": args.ffn_width}), splits.num_labels
    )
    reference = reference_of(edited, val)
    protocol = LatencyProtocol(args.batch_size, args.seq_len, args.threads, 10, args.repeats)
    example = example_inputs(tokenizer, splits.val.texts, protocol)
    deploy_cfg = OmegaConf.load(CONF_DIR / "deploy" / "default.yaml")
    deploy_cfg.latency.num_threads = args.threads

    rows: dict[str, dict] = {BASELINE: {"logits_of": full, "size_mb": float("nan")}}
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.backends:
            try:
                workdir_of = Path(workdir) / name
                converted = convert(name, edited, recipe, example, deploy_cfg, workdir_of)
                checks = check_outputs(collect_logits(converted.logits_of, val), reference)
            except Exception as exc:  # an unavailable or failing backend is reported, not fatal
                print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            rows[name] = {
                "logits_of": converted.logits_of,
                "size_mb": converted.size_mb,
                "convert_s": converted.seconds,
                **checks,
            }
            print(f"converted {name} in {converted.seconds:.1f} s", file=sys.stderr)
        timings: dict[str, list[list[float]]] = {name: [] for name in rows}
        for round_index in range(args.rounds):
            for name, row in rows.items():
                timings[name].append(round_latencies(row["logits_of"], example, protocol))
            print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)

    baseline_p50 = float(np.median(np.concatenate(timings[BASELINE])))
    print(
        f"\nMiniLM-L6 fine-tuned on {args.train_samples} Rotten Tomatoes snippets, FFN "
        f"{args.ffn_width}; batch {args.batch_size}, seq {args.seq_len}, {args.threads} threads, "
        f"{args.rounds} rounds x {args.repeats} calls; {cpu_model()}, torch {torch.__version__}"
    )
    print(
        f"Agreement and accuracy on {len(val)} validation snippets, against eager fp32 "
        f"at FFN {args.ffn_width}.\n"
    )
    print(
        "| backend | p50 ms | p95 ms | spread of round medians | speed-up vs eager fp32 "
        "full width | size MB | agreement | max logit diff | val acc | convert s |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in rows.items():
        pooled = np.concatenate(timings[name])
        medians = [statistics.median(r) for r in timings[name]]
        p50, p95 = float(np.median(pooled)), float(np.percentile(pooled, 95))
        print(
            f"| {name} | {p50:.2f} | {p95:.2f} | {min(medians):.2f}-{max(medians):.2f} | "
            f"{baseline_p50 / p50:.2f}x | {_cell(row, 'size_mb', '.1f')} | "
            f"{_cell(row, 'agreement', '.1%')} | {_cell(row, 'max_logit_diff', '.3g')} | "
            f"{_cell(row, 'val_accuracy', '.3f')} | {_cell(row, 'convert_s', '.1f')} |"
        )
    if args.study:
        compare_front(args, baseline_p50)
    return 0


def _cell(row: dict, key: str, spec: str) -> str:
    """A table cell; the full-width baseline is only timed, so it has no other figures."""
    value = row.get(key, float("nan"))
    return "-" if math.isnan(value) else format(value, spec)


def round_latencies(logits_of, example, protocol: LatencyProtocol) -> list[float]:
    """One round's per-call timings, in ms, after the protocol's warm-up."""
    return measure_latency(logits_of, example, protocol).samples_ms


def compare_front(args: argparse.Namespace, baseline_p50: float) -> None:
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    points = study_points(study)
    eager = [p for p in points if p.backend == "eager"]
    if not eager:
        print(f"\nStudy {args.study} has no eager fp32 point to compare with.")
        return
    best = max(p.val_accuracy for p in eager)
    close = [p for p in points if p.val_accuracy >= best - args.max_accuracy_drop]
    fastest = min(close, key=lambda p: p.latency_ms_p50)
    print(
        f"\nStudy {args.study}: best eager fp32 val_accuracy {best:.4f}. Fastest point within "
        f"{args.max_accuracy_drop:.2f} of it: trial {fastest.trial_number} "
        f"({fastest.backend}, model.ffn_width={fastest.params.get('model.ffn_width')}), "
        f"val_accuracy {fastest.val_accuracy:.4f}, p50 {fastest.latency_ms_p50:.2f} ms = "
        f"{baseline_p50 / fastest.latency_ms_p50:.2f}x faster than eager fp32 at full width "
        f"({baseline_p50:.2f} ms here)."
    )


if __name__ == "__main__":
    sys.exit(main())

"""Training time and accuracy of one configuration under variants of its training settings.

Trains one configuration of an experiment (the default study's MiniLM on Rotten Tomatoes unless
told otherwise) once per seed and variant, interleaved (seed by seed, every variant in turn)
so a drift of the machine's speed lands on all, and prints a table: training seconds (the
epochs and their validation passes, as `train_seconds` of a trial), tokens the training batches
carried (padding included) and final validation accuracy, median and range over seeds, and
the last variant's paired differences from the first:

    python scripts/bench_training.py --seeds 0 1 2 \
        --variants train.group_by_length=false train.group_by_length=true
    python scripts/bench_training.py --seeds 0 1 2 \
        --variants train.precision=fp32 train.precision=bf16

A variant is one override of the composed config (the default: random batches, then batches
grouped by length). Extra arguments after `--` are Hydra overrides (default:
`+experiment=bert_ffn`).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from bench_common import StudyData, spread, study_data, train_as_a_trial
from omegaconf import OmegaConf

from tuner.latency import cpu_model, isa_flags
from tuner.training import Placement


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["train.group_by_length=false", "train.group_by_length=true"],
        help="one config override each (KEY=VALUE), trained in turn",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write every run's figures to this file")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = parser.parse_args()
    args.overrides = args.overrides or ["+experiment=bert_ffn"]
    return args


class _CountingTokens:
    """The training split, counting the tokens (padding included) of the batches training
    draws from it."""

    def __init__(self, data) -> None:
        self.data, self.labels, self.tokens = data, data.labels, 0

    def __len__(self) -> int:
        return len(self.data)

    def batches(self, *args, **kwargs):
        for batch in self.data.batches(*args, **kwargs):
            self.tokens += batch.inputs[0].numel()
            yield batch


def train_once(data: StudyData, seed: int, variant: str) -> dict:
    """One trial's model and training under `variant`, counting the tokens it trained on."""
    cfg = OmegaConf.merge(data.cfg, OmegaConf.from_dotlist([variant]))
    counted = _CountingTokens(data.train_data)
    _, result, seconds = train_as_a_trial(cfg, data, seed, train_data=counted)
    return {
        "seed": seed,
        "variant": variant,
        "train_seconds": seconds,
        "tokens": counted.tokens,
        "val_accuracy": result.val_accuracy,
    }


def table(runs: list[dict], variants: list[str]) -> str:
    lines = [
        "| variant | train s | tokens per run | val accuracy |",
        "|---|---|---|---|",
    ]
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant]
        lines.append(
            f"| {variant} | {spread([r['train_seconds'] for r in mine], 1)} "
            f"| {spread([r['tokens'] for r in mine], 0)} "
            f"| {spread([r['val_accuracy'] for r in mine], 4)} |"
        )
    first, last = variants[0], variants[-1]
    by_seed = {(r["seed"], r["variant"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    time_ratio = [
        by_seed[s, last]["train_seconds"] / by_seed[s, first]["train_seconds"] for s in seeds
    ]
    accuracy_gain = [
        100 * (by_seed[s, last]["val_accuracy"] - by_seed[s, first]["val_accuracy"]) for s in seeds
    ]
    lines.append("")
    lines.append(
        f"{last} against {first}, seed by seed: train time x"
        + ", x".join(f"{r:.2f}" for r in time_ratio)
        + "; accuracy "
        + ", ".join(f"{g:+.2f}" for g in accuracy_gain)
        + " points."
    )
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    data = study_data(args.overrides)
    for variant in args.variants:  # a variant this machine cannot train is refused up front
        Placement.of(OmegaConf.merge(data.cfg, OmegaConf.from_dotlist([variant])).train)
    runs = []
    for seed in args.seeds:
        for variant in args.variants:
            run = train_once(data, seed, variant)
            print(
                f"seed {seed}, {variant}: {run['train_seconds']:.1f} s, "
                f"val_accuracy {run['val_accuracy']:.4f}",
                file=sys.stderr,
            )
            runs.append(run)
    print(
        f"{' '.join(args.overrides)}; {len(data.train_data)} training examples, "
        f"{args.threads} threads; {cpu_model()}, flags {isa_flags()}\n"
    )
    print(table(runs, args.variants))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {"overrides": args.overrides, "variants": args.variants, "runs": runs},
                out,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Accuracy of shrunken models trained with and without distillation from the study's teacher.

Trains the teacher a study with `train.distill.teacher=auto` trains (the unedited model, the
experiment's own knobs, `train.seed`), then every student architecture once per seed, per
`train.distill.alpha` (0 = not distilled) and per `train.distill.start_from` (the pretrained
weights, or the teacher's cut to the student's size; at alpha 0 this is the start alone,
which a study's trials never use: they have no teacher at alpha 0), interleaved seed by seed, and
prints a table: validation accuracy (median and range over seeds), the gain over the same
architecture and seed trained plainly (from pretrained, alpha 0), and training seconds (the
cost of the teacher's logits and, for mixed batches, its forward passes). Students of one
architecture share one latency, so the accuracy gain is a gain at the same latency.

    python scripts/bench_distill.py --students model.ffn_width=768,model.num_layers=3 \\
        model.ffn_width=768,model.num_layers=4 --start-from pretrained teacher \\
        -- +experiment=bert_ffn
    python scripts/bench_distill.py --students model.width_multiplier=0.25 \\
        --start-from pretrained teacher -- +experiment=resnet_mixup

Extra arguments after `--` are Hydra overrides (default: `+experiment=bert_ffn`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import yaml
from bench_common import StudyData, spread, study_data, train_as_a_trial
from omegaconf import OmegaConf

from tuner.latency import cpu_model, isa_flags
from tuner.training import Distillation


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--students",
        nargs="+",
        required=True,
        help="student architectures, each as comma-separated key=value model edits",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.5, 0.9])
    parser.add_argument(
        "--temperature", type=float, help="default: the experiment's train.distill.temperature"
    )
    parser.add_argument(
        "--hidden-weights",
        type=float,
        nargs="+",
        default=[0.0],
        help="weights of the hidden-state term (train.distill.hidden_weight; transformers), "
        "each tried with every alpha",
    )
    parser.add_argument(
        "--start-from",
        nargs="+",
        choices=["pretrained", "teacher"],
        default=["pretrained"],
        help="weights the students start from (train.distill.start_from), each tried with "
        "every loss",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write every run's figures to this file")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = parser.parse_args()
    args.overrides = args.overrides or ["+experiment=bert_ffn"]
    return args


def edits_of(student: str) -> dict[str, object]:
    """`model.ffn_width=768,model.num_layers=3` as {key: value}, values read as YAML."""
    pairs = (item.partition("=") for item in student.split(","))
    return {key.strip(): yaml.safe_load(value) for key, _, value in pairs}


def train_once(data: StudyData, edits: dict[str, object], seed: int, distillation, teacher=None):
    """One trial's model, accuracy and training seconds, with the student's `edits`, started
    from the pretrained weights or, given one, from the `teacher`'s."""
    cfg = data.cfg.copy()
    for key, value in edits.items():
        OmegaConf.update(cfg, key, value, merge=False)
    model, result, seconds = train_as_a_trial(
        cfg, data, seed, distillation=distillation, teacher=teacher
    )
    return model, result.val_accuracy, seconds


# What one training of a student is compared by: where it starts, alpha, hidden-state weight.
Training = tuple[str, float, float]
PLAIN: Training = ("pretrained", 0.0, 0.0)


def trainings(
    starts: list[str], alphas: list[float], hidden_weights: list[float]
) -> list[Training]:
    """Every training compared, plain training (from pretrained, not distilled) first."""
    losses = [(0.0, 0.0)] + [(a, h) for a in alphas for h in hidden_weights]
    compared = [(start, a, h) for start in starts for a, h in losses]
    return [PLAIN] + [t for t in compared if t != PLAIN]


def _training_of(run: dict) -> Training:
    return (run["start_from"], run["alpha"], run["hidden_weight"])


def table(runs: list[dict], compared: list[Training]) -> str:
    lines = [
        "| student | starts from | alpha | hidden weight | val accuracy (median [range]) | "
        "gain over plain training, per seed (points) | median gain | train s |",
        "|---|---|---:|---:|---|---|---:|---:|",
    ]
    plain = {(r["student"], r["seed"]): r for r in runs if _training_of(r) == PLAIN}
    for student in dict.fromkeys(r["student"] for r in runs):
        for training in compared:
            mine = [r for r in runs if r["student"] == student and _training_of(r) == training]
            gains = [
                100 * (r["val_accuracy"] - plain[student, r["seed"]]["val_accuracy"]) for r in mine
            ]
            start, alpha, hidden_weight = training
            is_plain = training == PLAIN
            lines.append(
                f"| {student} | {start} | {alpha:g} | {hidden_weight:g} | "
                f"{spread([r['val_accuracy'] for r in mine], 4)} | "
                + ("-" if is_plain else ", ".join(f"{g:+.2f}" for g in gains))
                + f" | {'-' if is_plain else f'{statistics.median(gains):+.2f}'} | "
                f"{statistics.median(r['train_seconds'] for r in mine):.1f} |"
            )
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    data = study_data(args.overrides)
    train_data, val_data = data.train_data, data.val_data
    if args.temperature is None:
        args.temperature = float(data.cfg.train.distill.temperature)
    print(f"CPU: {cpu_model()}; flags: {isa_flags()}", flush=True)
    teacher, teacher_accuracy, teacher_seconds = train_once(
        data, {}, int(data.cfg.train.seed), None
    )
    print(f"teacher (unedited): val accuracy {teacher_accuracy:.4f}, {teacher_seconds:.1f} s")
    started = time.perf_counter()
    teacher_logits = Distillation.of(teacher, 0.0, 1.0, train_data).train_logits
    logits_seconds = time.perf_counter() - started
    print(f"teacher logits of the {len(train_data)} training examples: {logits_seconds:.1f} s")
    compared = trainings(args.start_from, args.alphas, args.hidden_weights)
    runs = []
    for seed in args.seeds:
        for student in args.students:
            for start, alpha, hidden_weight in compared:
                distillation = (
                    Distillation(teacher, alpha, args.temperature, teacher_logits, hidden_weight)
                    if alpha > 0
                    else None
                )
                _, accuracy, seconds = train_once(
                    data,
                    edits_of(student),
                    seed,
                    distillation,
                    teacher=teacher if start == "teacher" else None,
                )
                runs.append(
                    {
                        "student": student,
                        "start_from": start,
                        "alpha": alpha,
                        "hidden_weight": hidden_weight,
                        "seed": seed,
                        "val_accuracy": accuracy,
                        "train_seconds": seconds,
                    }
                )
                print(
                    f"seed {seed} {student} from {start} alpha {alpha:g} "
                    f"hidden {hidden_weight:g}: "
                    f"{accuracy:.4f} ({seconds:.1f} s)",
                    flush=True,
                )
    print()
    print(
        f"Teacher: val accuracy {teacher_accuracy:.4f}; temperature {args.temperature:g}; "
        f"{len(train_data)} training / {len(val_data)} validation examples"
    )
    print(table(runs, compared))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "cpu": cpu_model(),
                    "flags": isa_flags(),
                    "overrides": args.overrides,
                    "teacher_accuracy": teacher_accuracy,
                    "teacher_logits_seconds": logits_seconds,
                    "temperature": args.temperature,
                    "runs": runs,
                },
                handle,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

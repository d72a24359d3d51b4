"""Re-time the front of a finished study and compare with its latency table.

A latency is kept once per (architecture, backend, protocol, machine) in the study's latency
table. This measures every front point's architecture again, now, in a fresh process (an
untrained model of the same architecture: weights do not change speed), under the study's own
protocol with its rounds interleaved across the points, and prints how far each moved by both
choices of `deploy.latency.statistic`: p50 (the median of the rounds' medians) and the fastest
timed call (the steadier on a shared machine, docs/benchmarks.md "Latency stability"):

    python scripts/retime_front.py +experiment=bert_ffn

Give the overrides the study was run with (storage, experiment, debug profile); the study is
read from `study.storage` under its `study.name`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import optuna
import torch

from tuner import console
from tuner.backends.cpu import isa_flags
from tuner.config import compose_config, with_params
from tuner.data import load_splits
from tuner.deploy import convert
from tuner.edits import EDITS, apply_edits
from tuner.front import study_points
from tuner.latency import LatencyProtocol, LatencyResult, cpu_model, time_rounds
from tuner.latency_table import LatencyTable
from tuner.recipe import ModelRecipe
from tuner.retrain import override_keys
from tuner.study import calibration_inputs, modality_for, prepare
from tuner.trial import ModelFactory


def main(overrides: list[str]) -> None:
    console.quiet_libraries()
    prepared = prepare(compose_config(overrides), {}, override_keys(overrides))
    cfg = prepared.cfg
    study = optuna.load_study(study_name=str(cfg.study.name), storage=str(cfg.study.storage))
    table = LatencyTable.of_attrs(study.user_attrs)
    splits = load_splits(cfg.data)
    modality = modality_for(cfg, prepared.space, splits)
    protocol = LatencyProtocol.from_config(cfg.deploy.latency)
    example = modality.example(splits.val.items, protocol)
    calibration = calibration_inputs(
        modality.encode(splits.train.items, splits.train.labels),
        int(cfg.deploy.calibration_samples),
    )
    factory = ModelFactory(splits.num_labels, {EDITS.get(n).config_key for n in EDITS})
    front = [p for p in study_points(study) if p.pareto]
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    loaded, stored = {}, {}
    with tempfile.TemporaryDirectory(prefix="retime-") as workdir:
        for point in front:
            point_cfg = with_params(cfg, point.params)
            model = factory.build(point_cfg.model, int(cfg.train.seed))
            apply_edits(model, point_cfg.model)
            model.eval()
            name = f"#{point.trial_number} {point.backend}"
            loaded[name] = convert(
                point.backend,
                model,
                ModelRecipe.of(point_cfg.model, splits.num_labels),
                example,
                point_cfg.deploy,
                Path(workdir) / str(point.trial_number),
                calibration,
            ).logits_of
            stored[name] = table.result(trials[point.trial_number].user_attrs.get("latency_key"))
        torch.set_num_threads(protocol.num_threads)
        again = time_rounds(loaded, example, protocol)
    print(f"CPU: {cpu_model()}; flags: {isa_flags()}")
    print(
        f"Study '{study.study_name}': {len(front)} front points, re-timed in {protocol.rounds} "
        "interleaved rounds\n"
    )
    print(
        "| point | table p50 ms (rounds, spread) | now p50 ms (spread) | moved | "
        "table fastest ms | now fastest ms | moved |"
    )
    print("|---|---|---|---|---|---|---|")
    moves: dict[str, list[float]] = {"p50": [], "fastest call": []}
    for name, rounds in again.items():
        now = LatencyResult.of_rounds(rounds)
        before = stored[name]
        if before is None:
            print(
                f"| {name} | not in the table | {now.p50_ms:.2f} ({now.spread_pct:.0f}%) | - | "
                f"- | {now.min_ms:.2f} | - |"
            )
            continue
        moved = 100.0 * (now.p50_ms - before.p50_ms) / before.p50_ms
        fastest_moved = 100.0 * (now.min_ms - before.min_ms) / before.min_ms
        moves["p50"].append(abs(moved))
        moves["fastest call"].append(abs(fastest_moved))
        print(
            f"| {name} | {before.p50_ms:.2f} ({before.rounds}, {before.spread_pct:.0f}%) | "
            f"{now.p50_ms:.2f} ({now.spread_pct:.0f}%) | {moved:+.1f}% | "
            f"{before.min_ms:.2f} | {now.min_ms:.2f} | {fastest_moved:+.1f}% |"
        )
    for summary, moved in moves.items():
        if moved:
            within = sum(move < 10.0 for move in moved)
            print(
                f"\nBy {summary}: {within} of {len(moved)} within 10%; largest move "
                f"{max(moved):.1f}%, median {statistics.median(moved):.1f}%"
            )


if __name__ == "__main__":
    main(sys.argv[1:])

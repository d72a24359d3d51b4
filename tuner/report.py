"""`python -m tuner.report [overrides] [options]`: review a study, pick a point, check it once on
the held-out test split, and export it.

The study is found from the same config keys as `python -m tuner` (`+experiment=...`,
`study.name`, `study.storage`, `tracking.uri`, `debug=smoke`), so the command that ran a study
also reports on it, while it runs too: only complete points are read.

Reading the stored study and a point's accuracy on the test split are the study's
(`tuner.study.stored_study`, `tuner.study.held_out_accuracy`); this module is the command: its
options, the recommendation it shows and a profile on demand; `tuner.report_export` checks and
exports the recommended point.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path

import mlflow
import optuna

from tuner import console
from tuner.config import apply_debug, compose_config, resolve
from tuner.data import Splits, load_splits
from tuner.deploy import op_table, profile_logged
from tuner.errors import ConfigError
from tuner.front import (
    DEFAULT_MAX_ACCURACY_DROP,
    Baseline,
    Constraints,
    Point,
    Rule,
    biggest_difference,
    breakdown,
    eager_point_of,
    failures_of,
    front_of,
    recommend,
)
from tuner.front import messages as front_messages
from tuner.insight import MachinePeak, stored_peaks
from tuner.keys import DISAGREES_TAG_PREFIX
from tuner.quick_exit import quick_exit
from tuner.report_export import check_and_export
from tuner.secrets import mask_urls_in
from tuner.store import (
    CurrentSplit,
    Machine,
    data_changes,
    data_fingerprint,
    machines_in,
    settings_of,
)
from tuner.study import (
    load_study,
    machine_counts,
    machine_named,
    study_settings,
    test_accuracy,
)
from tuner.tracking import override_keys


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.report",
        description=(
            "Print a study's accuracy/latency front, recommend a point, evaluate it once on the "
            "held-out test split and optionally export it. Positional arguments are the Hydra "
            "overrides that name the study, as given to `python -m tuner`."
        ),
        epilog=(
            "Default rule: the fastest point within 1 accuracy point of the study's baseline, "
            "the best eager fp32 validation accuracy of its trained models. "
            "--max-latency-ms alone: the most accurate point within the budget. Both: the "
            "fastest point within the drop that fits the budget."
        ),
    )
    parser.add_argument("overrides", nargs="*", help="e.g. +experiment=bert_ffn debug=smoke")
    parser.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=None,
        metavar="D",
        help="accuracy units below the study's baseline (the best eager fp32 validation "
        f"accuracy; default {DEFAULT_MAX_ACCURACY_DROP}"
        ", or none when only --max-latency-ms is given)",
    )
    parser.add_argument("--max-latency-ms", type=float, default=None, metavar="MS")
    parser.add_argument("--export", type=Path, default=None, metavar="DIR")
    parser.add_argument(
        "--skip-test", action="store_true", help="do not evaluate on the test split"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=None,
        metavar="TRIAL",
        help="profile trial TRIAL's logged model now: one call at its latency protocol's input "
        "shape and threads, by operator and op class, with its graph's layout ops",
    )
    parser.add_argument(
        "--machine",
        default=None,
        metavar="NAME",
        help="the front and recommendation at machine NAME's latencies (a deploy.machine that "
        "trained or measured for the study: python -m tuner.measure)",
    )
    parser.add_argument(
        "--machines",
        action="store_true",
        help="list the study's machines, with how many of its points each has measured",
    )
    # Overrides and options in any order, as with `python -m tuner`.
    return parser.parse_intermixed_args(argv)


def check_export_directory(directory: Path | None) -> None:
    """Checked before anything is read or evaluated, so a bad option costs nothing."""
    if directory is not None and directory.exists() and any(directory.iterdir()):
        raise ConfigError(f"Invalid option --export {directory}: the directory is not empty")


def rule_of(args: argparse.Namespace) -> Rule:
    drop = args.max_accuracy_drop
    if drop is None and args.max_latency_ms is None:
        drop = DEFAULT_MAX_ACCURACY_DROP
    for flag, value in (("--max-accuracy-drop", drop), ("--max-latency-ms", args.max_latency_ms)):
        if value is not None and value < 0:
            raise ConfigError(f"Invalid option {flag} {value}: must be >= 0")
    return Rule(max_accuracy_drop=drop, max_latency_ms=args.max_latency_ms)


def logged_point(points: list[Point], trial_number: int, split: CurrentSplit) -> Point:
    """The point of trial `trial_number`, which must have a logged model (checked before
    anything is evaluated)."""
    point = next((p for p in points if p.trial_number == trial_number), None)
    if point is None and trial_number in split.left_out:
        raise ConfigError(
            f"Invalid option --profile {trial_number}: trial #{trial_number} was trained before "
            f"the recorded change of {split.changes_named()}, on another split"
        )
    if point is None:
        raise ConfigError(
            f"Invalid option --profile {trial_number}: the study has no complete point "
            f"#{trial_number}"
        )
    if point.model_uri is None or point.mlflow_run_id is None:
        raise ConfigError(
            f"Invalid option --profile {trial_number}: trial #{trial_number} has no logged model "
            "(a study logs the models of points that join the front when they are made)"
        )
    return point


def where_time_goes(
    point: Point, eager: Point | None, peaks: Mapping[str, MachinePeak], machine: Machine | None
) -> None:
    """The recommended point beside the most accurate eager one, by op class and roofline;
    nothing for points made before points kept their insight. Under `--machine`, said to be
    what the training worker profiled: a measuring worker times, it does not profile."""
    shown = [point] if eager is None or eager.trial_number == point.trial_number else [point, eager]
    if all(p.insight is None for p in shown):
        return
    console.console.print(breakdown(shown, peaks))
    if machine is not None:
        console.console.print(
            f"[dim]Latencies are {machine.name}'s; the profiles and rooflines were measured "
            "where the points were deployed, not there.[/]"
        )
    difference = None if len(shown) == 1 else biggest_difference(point, shown[1])
    if difference:
        console.console.print(difference)


def profile_on_demand(
    point: Point, splits_of: Callable[[], Splits], client: mlflow.MlflowClient
) -> None:
    """Print a fresh profile of the point's logged model."""
    assert point.model_uri is not None and point.mlflow_run_id is not None
    params = client.get_run(point.mlflow_run_id).data.params
    splits = splits_of()
    console.console.print(f"Profiling trial #{point.trial_number} ({point.backend}) ...")
    found = profile_logged(point.model_uri, splits.val.items, params)
    console.console.print(op_table(found))


def report(args: argparse.Namespace) -> int:
    rule = rule_of(args)
    check_export_directory(args.export)
    cfg = resolve(apply_debug(compose_config(args.overrides), override_keys(args.overrides)))
    study = load_study(cfg)
    constraints, data_cfg = study_settings(study, cfg, override_keys(args.overrides))
    # Read on first use, once: the test accuracy and a profile may both need the data.
    splits_of = cache(lambda: load_splits(data_cfg))
    mlflow.set_tracking_uri(str(cfg.tracking.uri))
    client = mlflow.MlflowClient(str(cfg.tracking.uri))
    if args.machines:
        list_machines(study, constraints)
        return 0
    machine = None if args.machine is None else machine_named(study, args.machine)
    if machine is not None:
        console.console.print(f"Latencies on machine {machine.name}: {machine.describe()}")
    trials = study.get_trials(deepcopy=False)
    points, baseline, split = front_of(trials, study.user_attrs, constraints, machine)
    split.refuse_without_points(study.study_name)
    front_messages.front_summary(
        study.study_name, points, failures_of(trials), baseline, constraints
    )
    if split.note():
        console.console.print(f"[yellow]{split.note()}[/]")
    to_profile = None if args.profile is None else logged_point(points, args.profile, split)
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if running:
        console.console.print(f"{len(running)} trial(s) still running: this is the front so far.")
    point = recommend(points, rule, baseline)
    if point is None:
        no_point(points, rule, baseline)
        status = 1
    else:
        front_messages.recommendation(point, rule.describe())
        if machine is not None:
            rechecked_on(point, machine.name, client)
        peaks = stored_peaks(study.user_attrs)
        where_time_goes(point, eager_point_of(points, baseline), peaks, machine)
        test_split = split.fingerprint or data_fingerprint(settings_of(cfg))
        changed = bool(data_changes(study.user_attrs))

        def evaluate(recommended: Point) -> float:
            return test_accuracy(recommended, splits_of, client, test_split, changed)

        status = check_and_export(args, study, point, rule, evaluate, client, machine)
    if to_profile is not None:
        profile_on_demand(to_profile, splits_of, client)
    return status


def rechecked_on(point: Point, machine: str, client: mlflow.MlflowClient) -> None:
    """What the measuring worker of `machine` found when it ran the point's logged model
    there, where it did."""
    if point.mlflow_run_id is None:
        return
    data = client.get_run(point.mlflow_run_id).data
    agreement = data.metrics.get(f"agreement.{machine}")
    if agreement is None:
        return
    if data.tags.get(f"{DISAGREES_TAG_PREFIX}{machine}") == "true":
        console.console.print(
            f"[yellow]On {machine} its logged model repeats only {agreement:.1%} of the "
            "validation predictions it made when deployed (tuner.disagrees): check its accuracy "
            "there before serving it.[/]"
        )
    else:
        console.console.print(
            f"On {machine} its logged model repeats {agreement:.1%} of its validation predictions."
        )


def list_machines(study: optuna.Study, constraints: Constraints) -> None:
    """The study's machines: what each is and how many of the study's points it measured."""
    machines = machines_in(study.user_attrs)
    if not machines:
        console.console.print(f"Study '{study.study_name}' has recorded no machine yet.")
    for name, (measured, total) in machine_counts(study, constraints).items():
        console.console.print(
            f"{name}: {measured} of {total} points measured; {machines[name].describe()}, "
            f"last seen {machines[name].at}"
        )


def no_point(points: list[Point], rule: Rule, baseline: Baseline) -> None:
    """Why no point is recommended."""
    console.console.print(f"[red]No point of the front is {rule.describe()}.[/]")
    front = [p for p in points if p.pareto]
    best = max(front, key=lambda p: p.val_accuracy, default=None)
    # Said only where the drop alone is what leaves every point out.
    if (
        best is not None
        and rule.max_accuracy_drop is not None
        and rule.max_latency_ms is None
        and best.val_accuracy < baseline.accuracy
    ):
        console.console.print(
            f"The front's most accurate point is #{best.trial_number} at "
            f"{best.val_accuracy:.4f}, {100 * (baseline.accuracy - best.val_accuracy):.2f} "
            f"point(s) below {baseline.describe()}: a larger --max-accuracy-drop reaches it."
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console.quiet_libraries()
    try:
        return report(args)
    except ConfigError as exc:
        print(f"error: {mask_urls_in(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    with quick_exit():
        sys.exit(main())

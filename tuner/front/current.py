"""The study's points, front and baseline over the points of its current data settings
(`tuner.store.data_settings`), as the study run, its MLflow front and the report show them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from tuner import console
from tuner.front import messages
from tuner.front.constraints import Baseline, Constraints, baseline_of
from tuner.front.points import Point, failures_of, points_of
from tuner.store import CurrentSplit, LatencyTable, Machine, current_split


def front_of(
    trials: Sequence[optuna.trial.FrozenTrial],
    study_attrs: Mapping[str, Any],
    constraints: Constraints,
    machine: Machine | None = None,
) -> tuple[list[Point], Baseline, CurrentSplit]:
    """The points and baseline of the trials made on the study's current data settings (a
    point of another split neither joins the front nor sets the baseline), and that split.
    With a `machine`, the points at their latencies there (those it has measured)."""
    split = current_split(trials, study_attrs)
    table = LatencyTable.of_attrs(study_attrs)
    on = None if machine is None else machine.record
    return points_of(split.trials, constraints, table, on), baseline_of(split.trials), split


def summarise_front(study: optuna.Study, constraints: Constraints) -> list[Point]:
    """Print the study's front, with its failures, baseline and any points left out for another
    split; return its points."""
    trials = study.get_trials(deepcopy=False)
    points, baseline, split = front_of(trials, study.user_attrs, constraints)
    messages.front_summary(study.study_name, points, failures_of(trials), baseline, constraints)
    if split.note():
        console.console.print(f"[yellow]{split.note()}[/]")
    return points

"""A study's front at one machine's latencies (`tuner.store.machines`), as a measuring worker
publishes it on the study's MLflow parent run and the report reads it."""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from omegaconf import DictConfig

from tuner import console
from tuner.errors import ConfigError
from tuner.front import Baseline, Constraints, Point, convergence, front_note, front_of
from tuner.store import Machine, machines_in
from tuner.tracking import Tracker


def machine_named(study: optuna.Study, name: str) -> Machine:
    """The study's machine `name`; an unknown one is refused with the names it has."""
    machines = machines_in(study.user_attrs)
    if name not in machines:
        known = ", ".join(sorted(machines)) or "none"
        raise ConfigError(
            f"Invalid option --machine {name}: study '{study.study_name}' has no latencies "
            f"of a machine of that name (its machines: {known})"
        )
    return machines[name]


def machine_counts(study: optuna.Study, constraints: Constraints) -> dict[str, tuple[int, int]]:
    """Each machine of the study: (points measured there, points of the study)."""
    trials = study.get_trials(deepcopy=False)
    every, _, _ = front_of(trials, study.user_attrs, constraints)
    complete = len(every)
    return {
        name: (len(front_of(trials, study.user_attrs, constraints, machine)[0]), complete)
        for name, machine in sorted(machines_in(study.user_attrs).items())
    }


def publish_machine_front(
    study: optuna.Study,
    machine: Machine,
    points: list[Point],
    baseline: Baseline,
    tracker: Tracker,
    hypervolume_reference: DictConfig,
    notes: Sequence[str] = (),
) -> None:
    """The front of `points` (the study's at `machine`'s latencies, `front_of`) on the study's
    latest MLflow parent run (said where the study has none), with `notes` below its
    summary."""
    parent_id = tracker.latest_parent(study.study_name)
    if parent_id is None:
        console.console.print(
            f"[yellow]Study '{study.study_name}' has no MLflow parent run in this tracking "
            "store: the machine's front is not published there.[/]"
        )
        return
    progress = convergence(study, hypervolume_reference, points, machine=machine.name)
    note = front_note(
        study.study_name, points, progress, machine.record, baseline, machine=machine.name
    )
    note += "".join(f"\n\n{line}" for line in notes)
    tracker.publish_machine_front(parent_id, study.study_name, machine.name, points, note)
    if progress is not None:
        metrics = {
            f"hypervolume.{machine.name}": progress.hypervolume,
            f"pareto_points.{machine.name}": float(progress.front_size),
            f"measured_points.{machine.name}": float(len(points)),
        }
        tracker.log_metrics(parent_id, metrics, step=len(points))
    console.console.print(
        f"Front on machine {machine.name} published on MLflow run {parent_id} "
        f"(pareto/{machine.name}/, tags pareto.{machine.name})."
    )

"""A study's front at one machine's latencies (`tuner.store.machines`), as a measuring worker
publishes it on the study's MLflow parent run and the report reads it."""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from omegaconf import DictConfig

from tuner import console
from tuner.errors import ConfigError
from tuner.front import Constraints, Point, convergence, front_note, front_of
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
    constraints: Constraints,
    tracker: Tracker,
    hypervolume_reference: DictConfig,
    notes: Sequence[str] = (),
) -> list[Point]:
    """The front at `machine`'s latencies, on the study's latest MLflow parent run (said where
    the study has none), with `notes` below its summary; returns its points."""
    trials = study.get_trials(deepcopy=False)
    points, baseline, _ = front_of(trials, study.user_attrs, constraints, machine)
    parent_id = tracker.latest_parent(study.study_name)
    if parent_id is None:
        console.console.print(
            f"[yellow]Study '{study.study_name}' has no MLflow parent run in this tracking "
            "store: the machine's front is not published there.[/]"
        )
        return points
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
    return points


def front_lines(points: Sequence[Point]) -> list[str]:
    """The front, fastest first, one line per point."""
    front = sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms)
    return [
        f"  #{p.trial_number:<4} {p.backend:<28} val_accuracy {p.val_accuracy:.4f}  "
        f"{p.latency_statistic} {p.latency_ms:7.2f} ms"
        for p in front
    ]

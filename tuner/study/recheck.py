"""A front's accuracy re-checked on the machine that will serve: int8 kernels differ by CPU, so a
measuring worker runs each front point's logged model on the validation split here and compares
its labels with those the point predicted when it was deployed (`PREDICTIONS_ARTIFACT`). Each
point's agreement and accuracy here are logged on its run (`agreement.<machine>`,
`val_accuracy.<machine>`); one that agrees less than `1 - deploy.agreement_tolerance` is tagged
`tuner.disagrees.<machine>=true` and said."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import mlflow

from tuner import console
from tuner.data import Splits
from tuner.deploy import load_point_model
from tuner.front import Point
from tuner.keys import DISAGREES_TAG_PREFIX, PREDICTIONS_ARTIFACT
from tuner.modalities import MODALITIES
from tuner.tracking import set_run_tags


@dataclass(frozen=True)
class Recheck:
    """A front point's logged model run here: its validation accuracy, and its agreement with
    the labels it predicted when deployed (None: none were recorded, or it has no model)."""

    point: Point
    accuracy: float | None
    agreement: float | None
    disagrees: bool
    absent: str | None = None


def recheck_front(
    points: Sequence[Point],
    splits: Splits,
    client: mlflow.MlflowClient,
    machine: str,
    tolerance: float,
) -> list[Recheck]:
    """Every front point of `points` re-checked here, recorded on its run and said."""
    front = sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms)
    if not front:
        return []
    console.console.print(
        f"Re-checking the accuracy of {len(front)} front point(s) on {machine} through their "
        f"logged models ({len(splits.val)} validation examples)"
    )
    serving_input = MODALITIES.get(splits.modality).serving_input(splits.val.items)
    expected = [splits.label_names[label] for label in splits.val.labels]
    done = []
    for point in front:
        if point.model_uri is None or point.mlflow_run_id is None:
            done.append(Recheck(point, None, None, False, "it has no logged model"))
            continue
        predicted = load_point_model(point.model_uri).predict(serving_input)["label"].tolist()
        accuracy = sum(p == e for p, e in zip(predicted, expected, strict=True)) / len(expected)
        recorded = _recorded(client, point.mlflow_run_id)
        agreement = (
            None
            if recorded is None or len(recorded) != len(predicted)
            else sum(p == r for p, r in zip(predicted, recorded, strict=True)) / len(predicted)
        )
        disagrees = agreement is not None and agreement < 1 - tolerance
        _log(client, point.mlflow_run_id, machine, accuracy, agreement, disagrees)
        absent = None if agreement is not None else "no predictions were recorded when deployed"
        done.append(Recheck(point, accuracy, agreement, disagrees, absent))
    for found in done:
        _say(found, machine, tolerance)
    return done


def _recorded(client: mlflow.MlflowClient, run_id: str) -> list[str] | None:
    """The labels the point predicted when it was deployed; None for a point made before they
    were recorded."""
    with TemporaryDirectory() as directory:
        try:
            path = client.download_artifacts(run_id, PREDICTIONS_ARTIFACT, directory)
        except Exception:  # no such artifact
            return None
        return list(json.loads(Path(path).read_text())["labels"])


def _log(
    client: mlflow.MlflowClient,
    run_id: str,
    machine: str,
    accuracy: float,
    agreement: float | None,
    disagrees: bool,
) -> None:
    client.log_metric(run_id, f"val_accuracy.{machine}", accuracy)
    if agreement is not None:
        client.log_metric(run_id, f"agreement.{machine}", agreement)
        # Two workers of one machine may re-check one point together.
        set_run_tags(client, run_id, {f"{DISAGREES_TAG_PREFIX}{machine}": str(disagrees).lower()})


def _say(found: Recheck, machine: str, tolerance: float) -> None:
    point = found.point
    label = f"#{point.trial_number} {point.backend}"
    if found.accuracy is None:
        console.console.print(f"  {label:<32} not re-checked: {found.absent}")
        return
    line = (
        f"  {label:<32} val_accuracy here {found.accuracy:.4f} (recorded {point.val_accuracy:.4f})"
    )
    if found.agreement is None:
        console.console.print(f"{line}; {found.absent}")
    elif found.disagrees:
        console.console.print(
            f"[yellow]{line}; agrees with its recorded predictions on only "
            f"{found.agreement:.1%} (deploy.agreement_tolerance={tolerance:g}): marked "
            f"{DISAGREES_TAG_PREFIX}{machine}=true[/]"
        )
    else:
        console.console.print(
            f"{line}; agrees with its recorded predictions on {found.agreement:.1%}"
        )


def recheck_note(found: Recheck, machine: str, tolerance: float) -> str:
    """One line of the machine's front summary (markdown) on what its re-check found."""
    point = found.point
    label = f"#{point.trial_number} {point.backend}"
    if found.accuracy is None or found.agreement is None:
        return f"{label}: not re-checked against recorded predictions ({found.absent})."
    verdict = (
        f"**disagrees** beyond deploy.agreement_tolerance={tolerance:g}"
        if found.disagrees
        else "agrees"
    )
    return (
        f"{label}: on {machine} its logged model repeats {found.agreement:.1%} of the "
        f"validation predictions it made when deployed ({verdict}); val_accuracy here "
        f"{found.accuracy:.4f}, recorded {point.val_accuracy:.4f}."
    )

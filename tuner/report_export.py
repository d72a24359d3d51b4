"""The report's last step: the recommended point's one check on the held-out test split, and
its export (the MLflow model and `point.json`) where `--export` asks for it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import optuna

from tuner import console
from tuner.errors import ConfigError
from tuner.front import Point, Rule
from tuner.keys import MODEL_ABSENT_TAG, MODEL_ERROR_TAG, RETRAIN_TAG
from tuner.latency import objective_name
from tuner.secrets import mask_urls_in
from tuner.store import Machine
from tuner.study import TEST_METRIC


def export(
    point: Point,
    directory: Path,
    summary: dict[str, Any],
) -> None:
    """The MLflow model (artifact, input pipeline, code, requirements) and `point.json`."""
    directory.mkdir(parents=True, exist_ok=True)
    mlflow.artifacts.download_artifacts(
        artifact_uri=point.model_uri, dst_path=str(directory / "model")
    )
    (directory / "point.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def _summary(
    study: optuna.Study,
    point: Point,
    rule: Rule,
    accuracy: float | None,
    client: mlflow.MlflowClient,
    machine: Machine | None,
) -> dict[str, Any]:
    """What `point.json` says of the point: its latency with the protocol and machine it was
    measured on (`machine`'s, under `--machine`, not the training run's)."""
    run = client.get_run(point.mlflow_run_id) if point.mlflow_run_id else None
    params = run.data.params if run else {}
    retrain = run.data.tags.get(RETRAIN_TAG) if run else None
    measured = params if machine is None else machine.record
    protocol = {k: v for k, v in measured.items() if k.startswith("latency.")}
    return {
        "study": study.study_name,
        "trial": point.trial_number,
        "trained_in_trial": point.trained_in_trial,
        "backend": point.backend,
        "rule": rule.describe(),
        "val_accuracy": point.val_accuracy,
        TEST_METRIC: accuracy,
        objective_name(point.latency_statistic): point.latency_ms,
        "latency_ms_p95": point.latency_ms_p95,
        "model_size_mb": point.model_size_mb,
        "params": point.params,
        "machine": protocol.get("latency.machine"),
        "latency_protocol": protocol,
        "model_uri": point.model_uri,
        "mlflow_run_id": point.mlflow_run_id,
        # Runs recorded before passwords were masked may still hold one.
        "retrain": None if retrain is None else mask_urls_in(retrain),
    }


def why_no_model(point: Point, client: mlflow.MlflowClient) -> str:
    """Why a point has no logged model, as its MLflow run's tags say, and how to get one."""
    try:
        tags = client.get_run(point.mlflow_run_id).data.tags if point.mlflow_run_id else {}
    except mlflow.exceptions.MlflowException:
        tags = {}
    if MODEL_ABSENT_TAG in tags:
        return f"it {tags[MODEL_ABSENT_TAG]}"  # says how to get it
    retrain = "retrain it with the command in its MLflow run's `tuner.retrain` tag"
    if MODEL_ERROR_TAG in tags:
        return f"logging it failed ({tags[MODEL_ERROR_TAG]}); {retrain}"
    return f"its run records none (an earlier version of tuner made it); {retrain}"


def check_and_export(
    args: argparse.Namespace,
    study: optuna.Study,
    point: Point,
    rule: Rule,
    evaluate: Callable[[Point], float],
    client: mlflow.MlflowClient,
    machine: Machine | None,
) -> int:
    """The recommended point's test accuracy (`evaluate`), and its export where asked (at
    `machine`'s latency, under `--machine`)."""
    if point.model_uri is None:
        console.console.print(
            f"[yellow]Trial #{point.trial_number} has no logged model: "
            f"{why_no_model(point, client)}.[/]"
        )
        if args.export:
            raise ConfigError(f"Invalid option --export: trial #{point.trial_number} has no model")
        return 0
    accuracy = None if args.skip_test else evaluate(point)
    if accuracy is not None:
        console.console.print(
            f"Test accuracy {accuracy:.4f} (validation {point.val_accuracy:.4f}); logged as "
            f"`{TEST_METRIC}` on run {point.mlflow_run_id}."
        )
    if args.export:
        export(point, args.export, _summary(study, point, rule, accuracy, client, machine))
        console.console.print(f"Exported to {args.export} (model/, point.json).")
    return 0

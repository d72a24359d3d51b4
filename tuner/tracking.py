"""MLflow records of a study: one experiment, a parent run per invocation, a child run per trial.

Runs are created through `MlflowClient` with explicit ids (no fluent global state), so every run
is closed with the right status: FINISHED, FAILED with a `failure_reason` tag, or KILLED.
"""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from tuner.front import Point, front_table, plot_front

# MLflow caps a param value at 6000 characters.
_PARAM_LIMIT = 6000


def _params(values: Mapping[str, Any]) -> list[Param]:
    return [Param(key, str(value)[:_PARAM_LIMIT]) for key, value in values.items()]


class Tracker:
    def __init__(self, uri: str, experiment: str) -> None:
        mlflow.set_tracking_uri(uri)
        self.client = MlflowClient(uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (
            found.experiment_id if found else self.client.create_experiment(experiment)
        )

    def start_parent(self, study_name: str, params: Mapping[str, Any], config_yaml: str) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{study_name} {socket.gethostname()}",
            tags={"optuna.study": study_name, "tuner.role": "study"},
        )
        run_id = run.info.run_id
        self.client.log_batch(run_id, params=_params(params))
        self.client.log_text(run_id, config_yaml, "config.yaml")
        return run_id

    def start_trial(
        self,
        parent_id: str,
        study_name: str,
        trial_number: int,
        backend: str,
        params: Mapping[str, Any],
    ) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{trial_number}-{backend}",
            tags={
                "mlflow.parentRunId": parent_id,
                "optuna.study": study_name,
                "optuna.trial_number": str(trial_number),
                "deploy.backend": backend,
                "pareto": "false",
                "tuner.role": "trial",
            },
        )
        self.client.log_batch(run.info.run_id, params=_params(params))
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        timestamp = mlflow.utils.time.get_current_time_millis()
        batch = [Metric(key, float(value), timestamp, step) for key, value in metrics.items()]
        self.client.log_batch(run_id, metrics=batch)

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        self.client.log_batch(run_id, params=_params(params))

    def finish(self, run_id: str) -> None:
        self.client.set_terminated(run_id, "FINISHED")

    def fail(self, run_id: str, reason: str) -> None:
        self.client.set_tag(run_id, "failure_reason", reason[:5000])
        self.client.set_terminated(run_id, "FAILED")

    def kill(self, run_id: str) -> None:
        self.client.set_terminated(run_id, "KILLED")

    def publish_front(self, parent_id: str, study_name: str, points: list[Point]) -> None:
        """Write the front artifacts on the parent run and re-tag every trial run of the study."""
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            front_table(points).to_csv(directory / "front.csv", index=False)
            plot_front(points, f"{study_name}: accuracy vs latency", directory / "front.png")
            for name in ("front.csv", "front.png"):
                self.client.log_artifact(parent_id, str(directory / name), "pareto")
        self._tag_pareto(study_name, {(p.trial_number, p.backend): p.pareto for p in points})

    def _tag_pareto(self, study_name: str, on_front: Mapping[tuple[int, str], bool]) -> None:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`optuna.study` = '{study_name}' and tags.`tuner.role` = 'trial'",
            max_results=50000,
        )
        for run in runs:
            tags = run.data.tags
            key = (int(tags["optuna.trial_number"]), tags.get("deploy.backend", ""))
            wanted = "true" if on_front.get(key, False) else "false"
            if tags.get("pareto") != wanted:
                self.client.set_tag(run.info.run_id, "pareto", wanted)

    def log_dict(self, run_id: str, values: Mapping[str, Any], path: str) -> None:
        self.client.log_text(run_id, json.dumps(values, indent=2, default=str), path)

"""MLflow records of a study: one experiment, a parent run per invocation, a child run per trial.

Runs are created through `MlflowClient` with explicit ids (no fluent global state), so every run
is closed with the right status: FINISHED, FAILED with a `failure_reason` tag, or KILLED.
"""

from __future__ import annotations

import fcntl
import math
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tuner.front import (
    Point,
    front_table,
    plot_front_html,
    plot_front_png,
    plot_profile_html,
    plot_profile_png,
    profiled_front,
)
from tuner.insight import GraphDump, OpProfile
from tuner.keys import MODEL_ABSENT_TAG, MODEL_ERROR_TAG, MODEL_URI_TAG, ROLE_TAG, TRAINED_IN_TAG
from tuner.latency import LatencyResult
from tuner.secrets import mask_urls_in
from tuner.store import RetryingProxy
from tuner.training import EpochResult

# MLflow caps a param value at 6000 characters.
_PARAM_LIMIT = 6000
JOINED_LATER = (
    "joined the front after it was made (a later measurement session raised another point's "
    "latency); retrain it with its tuner.retrain command to deploy it"
)


def set_run_tags(client: Any, run_id: str, tags: Mapping[str, str]) -> None:
    """Tag a run through MLflow's batch call, never `set_tag`: several workers tag one study's
    runs (its fronts, re-checks, test accuracy), and `set_tag` inserts a tag new to the run
    without looking again, so of two workers tagging at once one fails on the duplicate key;
    the batch call takes the other's row as there and updates it. URLs in values are masked."""
    masked = [RunTag(key, mask_urls_in(value)) for key, value in tags.items()]
    client.log_batch(run_id, tags=masked)


def _params(values: Mapping[str, Any]) -> list[Param]:
    # Params, tags and failure reasons are read by everyone with access to the experiment.
    return [Param(key, mask_urls_in(str(value))[:_PARAM_LIMIT]) for key, value in values.items()]


@contextmanager
def creating(uri: str) -> Iterator[None]:
    """Held while a worker opens (and may create) the tracking store. MLflow builds a SQLite
    store by running its schema migrations; two workers doing that at once in one directory
    (the default `tracking.uri`) break each other's migration, so on SQLite they take turns
    under a lock file beside the database. Server stores migrate once, on their side."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    if not database.parent.is_dir():
        yield  # MLflow reports the missing directory itself
        return
    with open(f"{database}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Tracker:
    def __init__(self, uri: str, experiment: str) -> None:
        mlflow.set_tracking_uri(uri)
        with creating(uri):
            # Every call rides out a restarting tracking database (see tuner.store.retries).
            self.client = RetryingProxy(MlflowClient(uri))
            self.experiment_id = self._experiment_id(experiment)

    def _experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:
            # Another worker created it first.
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def start_parent(self, study_name: str, params: Mapping[str, Any], config_yaml: str) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{study_name} {socket.gethostname()}",
            tags={"optuna.study": study_name, ROLE_TAG: "study"},
        )
        run_id = run.info.run_id
        self.client.log_batch(run_id, params=_params(params))
        self.client.log_text(run_id, config_yaml, "config.yaml")
        return run_id

    def start_trial(
        self,
        parent_id: str,
        study_name: str,
        trial_number: int | None,
        backend: str | None,
        params: Mapping[str, Any],
        trained_in_trial: int,
    ) -> str:
        """A child run for one point; a point added after its trial gets its number later, and
        a trial's own run its backend once the model is deployed (`set_backend`).

        `trained_in_trial` names the trial whose training produced the model, shared by every
        backend's point of that model.
        """
        tags = {
            "mlflow.parentRunId": parent_id,
            "optuna.study": study_name,
            "pareto": "false",
            ROLE_TAG: "trial",
            TRAINED_IN_TAG: str(trained_in_trial),
        }
        if trial_number is not None:
            tags["optuna.trial_number"] = str(trial_number)
        run = self.client.create_run(
            self.experiment_id,
            run_name=None if trial_number is None else f"trial-{trial_number}",
            tags=tags,
        )
        self.client.log_batch(run.info.run_id, params=_params(params))
        if backend is not None:
            self.set_backend(run.info.run_id, trial_number, backend)
        return run.info.run_id

    def set_backend(self, run_id: str, trial_number: int | None, backend: str) -> None:
        self.set_tags(run_id, {"deploy.backend": backend})
        self.client.log_param(run_id, "deploy.backend", backend)
        if trial_number is not None:
            self.set_trial_number(run_id, trial_number, backend)

    def set_trial_number(self, run_id: str, trial_number: int, backend: str) -> None:
        self.set_tags(run_id, {"optuna.trial_number": str(trial_number)})
        # Through set_tag, which MLflow turns into a rename of the run; only this worker
        # writes it.
        self.client.set_tag(run_id, "mlflow.runName", f"trial-{trial_number}-{backend}")

    def replay_epochs(self, run_id: str, epochs: Sequence[EpochResult]) -> None:
        """The per-epoch history of the training a point shares with its trial."""
        for epoch in epochs:
            metrics = {"train_loss": epoch.train_loss, "val_accuracy": epoch.val_accuracy}
            self.log_metrics(run_id, metrics, step=epoch.epoch)

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        timestamp = mlflow.utils.time.get_current_time_millis()
        batch = [Metric(key, float(value), timestamp, step) for key, value in metrics.items()]
        self.client.log_batch(run_id, metrics=batch)

    def revise_latencies(self, study_name: str, latencies: Mapping[int, LatencyResult]) -> None:
        """Give each point run of the study whose latency metrics are not its latency now
        (trial number -> latency) the newer values, at the step of their latest: MLflow shows
        them, and the metric history keeps what the point was made with. (Rounds are no guide:
        a key's pooled sessions change as unsteady ones are left out, not only as they grow.)"""
        for run in self._study_runs(study_name):
            number = run.data.tags.get("optuna.trial_number")
            latency = None if number is None else latencies.get(int(number))
            if latency is None or "latency_rounds" not in run.data.metrics:
                continue
            now = latency.metrics()
            logged = run.data.metrics
            if all(name in logged and math.isclose(logged[name], now[name]) for name in now):
                continue
            history = self.client.get_metric_history(run.info.run_id, "latency_rounds")
            step = max(m.step for m in history)
            self.log_metrics(run.info.run_id, latency.metrics(), step=step)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        set_run_tags(self.client, run_id, tags)

    def log_notes(self, run_id: str, notes: Mapping[str, Any]) -> None:
        """What a backend says its artifact holds: all of it as `deploy/notes.json`, and one
        `deploy.<name>` tag per note (a mapping as `key=value` pairs) but for mappings too long
        to read as a tag (a score per node, say)."""
        tags = {
            f"deploy.{name}": _tag_value(value)
            for name, value in notes.items()
            if not (isinstance(value, Mapping) and len(value) > _MAX_TAG_ENTRIES)
        }
        self.set_tags(run_id, tags)
        self.client.log_dict(run_id, dict(notes), "deploy/notes.json")

    def log_graph(self, run_id: str, graph: GraphDump) -> None:
        """The artifact's operator graph: counts by op type and class as `graph/ops.json`,
        the node listing as `graph/graph.txt`."""
        self.client.log_dict(run_id, graph.summary(), "graph/ops.json")
        self.client.log_text(run_id, graph.text, "graph/graph.txt")

    def log_profile(self, run_id: str, profile: OpProfile) -> None:
        """One call's time by operator as `profile/ops.csv` (op type, class, calls, total ms,
        share); its per-class metrics are logged with the point's."""
        self.client.log_text(run_id, profile.csv(), "profile/ops.csv")

    def log_directory(self, run_id: str, directory: Path) -> str:
        """Log a directory's files under its own name; returns where they are stored (the
        run's artifact location, readable without this tracking store, unlike `runs:/`)."""
        self.client.log_artifacts(run_id, str(directory), directory.name)
        return f"{self.client.get_run(run_id).info.artifact_uri}/{directory.name}"

    def finish(self, run_id: str) -> None:
        self.client.set_terminated(run_id, "FINISHED")

    def fail(self, run_id: str, reason: str) -> None:
        self.close(run_id, "FAILED", reason)

    def kill(self, run_id: str) -> None:
        self.client.set_terminated(run_id, "KILLED")

    def close(self, run_id: str, status: str, reason: str) -> None:
        """End a run that did not finish, with the reason as its `failure_reason` tag."""
        self.set_tags(run_id, {"failure_reason": reason[:5000]})
        self.client.set_terminated(run_id, status)

    def publish_front(
        self, parent_id: str, study_name: str, points: list[Point], note: str
    ) -> None:
        """Write the front on the parent run (table, plots, a summary as its description, and
        where its points were profiled, their time by op class) and re-tag every trial run of
        the study with `pareto`."""
        self._log_front(parent_id, points, f"{study_name}: accuracy vs latency", "pareto")
        if profiled_front(points):
            with tempfile.TemporaryDirectory() as tmp:
                directory, title = Path(tmp), f"{study_name}: where the front's time goes"
                plot_profile_png(points, title, directory / "by_backend.png")
                plot_profile_html(points, title, directory / "by_backend.html")
                self.client.log_artifacts(parent_id, str(directory), "profile")
        # MLflow shows this tag as the run's description.
        self.set_tags(parent_id, {"mlflow.note.content": note})
        self._tag_pareto(study_name, {p.trial_number: p.pareto for p in points})

    def publish_machine_front(
        self, parent_id: str, study_name: str, machine: str, points: list[Point], note: str
    ) -> None:
        """Write the front at one machine's latencies on the parent run
        (`pareto/<machine>/front.csv|png|html`, the note as `front.md`) and tag every trial run
        of the study with `pareto.<machine>`: whether its point is on that front (`none`: not
        measured there)."""
        title = f"{study_name} on {machine}: accuracy vs latency"
        self._log_front(parent_id, points, title, f"pareto/{machine}", note)
        self.tag_machine_front(study_name, machine, {p.trial_number: p.pareto for p in points})

    def tag_machine_front(
        self, study_name: str, machine: str, on_front: Mapping[int, bool]
    ) -> None:
        """Tag every trial run of the study with `pareto.<machine>`: `true` or `false` for the
        trials in `on_front`, `none` for the others."""
        for run in self._study_runs(study_name):
            number = run.data.tags.get("optuna.trial_number")
            found = None if number is None else on_front.get(int(number))
            wanted = "none" if found is None else str(found).lower()
            if run.data.tags.get(f"pareto.{machine}") != wanted:
                self.set_tags(run.info.run_id, {f"pareto.{machine}": wanted})

    def _log_front(
        self, parent_id: str, points: list[Point], title: str, folder: str, note: str = ""
    ) -> None:
        """The front as `front.csv`, `front.png` and `front.html` (and the note as `front.md`)
        in the parent run's `folder`."""
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            front_table(points).to_csv(directory / "front.csv", index=False)
            plot_front_png(points, title, directory / "front.png")
            plot_front_html(points, title, directory / "front.html")
            if note:
                (directory / "front.md").write_text(note + "\n")
            self.client.log_artifacts(parent_id, str(directory), folder)

    def latest_parent(self, study_name: str) -> str | None:
        """The study's latest parent run (one per invocation of `python -m tuner`)."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`optuna.study` = '{study_name}' and tags.`{ROLE_TAG}` = 'study'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def close_abandoned(
        self, study_name: str, trained_in: int, reason: str, status: str = "FAILED"
    ) -> None:
        """Close what a stopped worker left running for the model of trial `trained_in`: its
        point runs with `status` and the reason, and its invocation's parent run KILLED."""
        for run in self.close_trained_in(study_name, trained_in, reason, status):
            parent_id = run.data.tags.get("mlflow.parentRunId")
            if parent_id and self.client.get_run(parent_id).info.status == "RUNNING":
                self.close(parent_id, "KILLED", reason)

    def close_trained_in(
        self, study_name: str, trained_in: int, reason: str, status: str = "FAILED"
    ) -> list:
        """Close with `status` and the reason the runs of the model of trial `trained_in`
        still running (its own and its points'); returns them."""
        runs = self._study_runs(
            study_name,
            f"tags.`tuner.trained_in_trial` = '{trained_in}' and attributes.status = 'RUNNING'",
        )
        for run in runs:
            self.close(run.info.run_id, status, reason)
        return runs

    def _study_runs(self, study_name: str, condition: str = "") -> list:
        filter_string = f"tags.`optuna.study` = '{study_name}' and tags.`tuner.role` = 'trial'"
        return self.client.search_runs(
            [self.experiment_id],
            filter_string=f"{filter_string} and {condition}" if condition else filter_string,
            max_results=50000,
        )

    def _tag_pareto(self, study_name: str, on_front: Mapping[int, bool]) -> None:
        runs = self._study_runs(study_name)
        for run in runs:
            number = run.data.tags.get("optuna.trial_number")
            wanted = "true" if number is not None and on_front.get(int(number), False) else "false"
            tags = {} if run.data.tags.get("pareto") == wanted else {"pareto": wanted}
            said = {MODEL_URI_TAG, MODEL_ERROR_TAG, MODEL_ABSENT_TAG} & set(run.data.tags)
            if wanted == "true" and not said:
                # Models are logged for the points on the front when they are made; under p50
                # a later session can raise a front latency and let on a point that was not.
                tags[MODEL_ABSENT_TAG] = JOINED_LATER
            if tags:
                self.set_tags(run.info.run_id, tags)


# A note that maps more keys than this is left to deploy/notes.json.
_MAX_TAG_ENTRIES = 20


def _tag_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        text = " ".join(f"{key}={_tag_value(item)}" for key, item in value.items())
    elif isinstance(value, list):
        text = " ".join(_tag_value(item) for item in value)
    else:
        text = str(value)
    # MLflow's limit on a tag's value; the whole of it is in deploy/notes.json.
    return (text or "none")[:5000]

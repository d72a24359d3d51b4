"""The tracking store: opening it and tagging a study's runs are safe when several workers do it
together, and what a backend says of its artifact lands on the run as tags and a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import warm

# Each worker says it is ready (its imports done), then waits to be released.
_ON_CUE = """
import sys, time
from pathlib import Path
from tuner.tracking import Tracker
folder = Path(sys.argv[1])
(folder / f"ready-{sys.argv[2]}").write_text(sys.argv[2])
while not (folder / "go").exists():
    time.sleep(0.001)
"""


def _released_together(code: str, folder: Path, *args: str, env=None) -> None:
    """Two workers run `_ON_CUE` then `code` (argv: the folder, the worker's index, `args`),
    released together once both are ready; both must succeed."""
    workers = [
        warm.Popen(
            [sys.executable, "-c", _ON_CUE + code, str(folder), str(me), *args],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for me in range(2)
    ]
    ready = [folder / f"ready-{me}" for me in range(2)]
    warm.wait_for_files(*ready, processes=workers, what="both workers were ready")
    (folder / "go").touch()
    for worker in workers:
        _, errors = worker.communicate(timeout=120)
        assert worker.returncode == 0, errors


def test_workers_that_start_together_share_a_new_sqlite_tracking_store(tmp_path):
    # Both create MLflow's database at the same moment, as two workers started together in
    # one working directory do with the default tracking.uri: MLflow's schema migrations of
    # one then broke the other's ("Online migration expected to match one row ...").
    # Without the lock this failed every time it was tried. The workers migrate as MLflow does,
    # not from the tests' template (mlflow_stores).
    _released_together(
        'Tracker(f"sqlite:///{folder}/mlflow.db", "study")',
        tmp_path,
        env={**os.environ, "TUNER_TESTS_MIGRATE": "1"},
    )


# Tag the 40 trial runs of study `s`: every third one is on the front of machine `shared`.
_TAG = """
tracker = Tracker(sys.argv[3], "study")
tracker.tag_machine_front("s", "shared", {number: number % 3 == 0 for number in range(40)})
"""


def test_workers_that_publish_one_machine_s_front_together_tag_every_run_once(
    tmp_path, postgres_database
):
    # Two measuring workers of one machine finish together and tag the study's runs with
    # pareto.<machine> at the same moment. A tag new to a run was inserted by both, and the
    # second insert broke its worker on the duplicate key (tag_pk).
    from mlflow.tracking import MlflowClient

    from tuner.keys import ROLE_TAG
    from tuner.tracking import Tracker

    url = postgres_database("mlflow")
    tracker = Tracker(url, "study")
    runs = {
        number: tracker.client.create_run(
            tracker.experiment_id,
            tags={"optuna.study": "s", ROLE_TAG: "trial", "optuna.trial_number": str(number)},
        ).info.run_id
        for number in range(40)
    }
    _released_together(_TAG, tmp_path, url)
    client = MlflowClient(url)
    tagged = {number: client.get_run(id).data.tags["pareto.shared"] for number, id in runs.items()}
    # Every third trial, 0, 3, ..., 39, is on the front.
    assert tagged == {number: "true" if number in range(0, 40, 3) else "false" for number in runs}


def test_what_an_artifact_holds_is_logged_as_tags_and_a_json_file(tmp_path, monkeypatch):
    import json

    from mlflow.tracking import MlflowClient

    from tuner.tracking.runs import Tracker

    monkeypatch.chdir(tmp_path)  # MLflow's artifacts go under the working directory
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "study")
    parent = tracker.start_parent("study", {}, "")
    run_id = tracker.start_trial(parent, "study", 0, "onnxruntime_fused", {}, trained_in_trial=0)
    sensitivity = {f"node{i}": i / 100 for i in range(30)}
    notes = {
        "fused_ops": {"Attention": 6, "SkipLayerNormalization": 12},
        "attention_fused": True,
        "fp32_nodes": ["a/MatMul", "b/MatMul"],
        "train_agreement": 0.99612,
        "sensitivity": sensitivity,
    }
    tracker.log_notes(run_id, notes)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    tags = client.get_run(run_id).data.tags
    assert tags["deploy.fused_ops"] == "Attention=6 SkipLayerNormalization=12"
    assert tags["deploy.attention_fused"] == "true"
    assert tags["deploy.fp32_nodes"] == "a/MatMul b/MatMul"
    assert tags["deploy.train_agreement"] == "0.9961"
    # A score per node is too long to read as a tag: it is in the file only.
    assert "deploy.sensitivity" not in tags
    assert tags["deploy.backend"] == "onnxruntime_fused"
    written = client.download_artifacts(run_id, "deploy/notes.json", str(tmp_path))
    assert json.loads(Path(written).read_text()) == notes


def test_a_point_run_gets_its_key_s_latency_when_it_moves_on_as_many_rounds(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from tuner.latency.protocol import LatencyResult
    from tuner.tracking.runs import Tracker

    monkeypatch.chdir(tmp_path)
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "study")
    parent = tracker.start_parent("study", {}, "")
    run_id = tracker.start_trial(parent, "study", 3, "eager", {}, trained_in_trial=3)
    tracker.set_trial_number(run_id, 3, "eager")
    made = LatencyResult.of_rounds([[4.0, 4.0], [6.0, 6.0]])
    tracker.log_metrics(run_id, made.metrics())
    # As many rounds, another latency (a slow session left out, a steady one pooled).
    now = LatencyResult.of_rounds([[2.0, 2.0], [3.0, 3.0]])
    tracker.revise_latencies("study", {3: now})
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert client.get_run(run_id).data.metrics["latency_ms_p50"] == 2.5
    history = client.get_metric_history(run_id, "latency_ms_p50")
    assert sorted(m.value for m in history) == [2.5, 5.0]
    # The same latency again: nothing new is logged.
    tracker.revise_latencies("study", {3: now})
    assert len(client.get_metric_history(run_id, "latency_ms_p50")) == 2


def test_the_report_says_why_a_point_has_no_logged_model(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from tuner.front.points import Point
    from tuner.keys import MODEL_ABSENT_TAG, MODEL_ERROR_TAG
    from tuner.report_export import why_no_model
    from tuner.tracking.runs import JOINED_LATER, Tracker

    monkeypatch.chdir(tmp_path)
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "study")
    parent = tracker.start_parent("study", {}, "")
    tags = [{MODEL_ABSENT_TAG: JOINED_LATER}, {MODEL_ERROR_TAG: "OSError: disk full"}, {}]
    runs = []
    for number, run_tags in enumerate(tags):
        runs.append(tracker.start_trial(parent, "study", number, "eager", {}, number))
        tracker.set_tags(runs[-1], run_tags)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")

    def why(run_id: str | None) -> str:
        point = Point(0, "eager", 0.8, 1.0, 1.2, 1.0, 0, pareto=True, mlflow_run_id=run_id)
        return why_no_model(point, client)

    assert why(runs[0]).startswith("it joined the front after it was made")
    assert why(runs[1]).startswith("logging it failed (OSError: disk full); retrain it")
    assert why(runs[2]).startswith("its run records none")
    assert why("0" * 32).startswith("its run records none")  # a run the store does not have
    assert why(None).startswith("its run records none")

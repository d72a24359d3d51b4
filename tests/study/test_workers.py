"""Many workers on one study (real PostgreSQL), and trials that survive dead workers, signals
and a database restart. Workers are real `python -m tuner` processes at `debug=smoke` size."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import warm
from conftest import TWO_BACKENDS, runnable_backends
from mlflow.tracking import MlflowClient
from postgres import RESTARTED, postgres_control

from tuner.keys import (
    DUPLICATE_ATTR,
    FAIL_REASON_ATTR,
    ROLE_TAG,
    SKIPPED_ATTR,
    STORED_TEACHERS_ATTR,
    TEACHER_TAG,
    TEACHER_TRIAL_ATTR,
    TRAINED_IN_ATTR,
    TRAINED_IN_TAG,
)

# Real studies in subprocesses: the full suite's, not the fast selection's.
pytestmark = pytest.mark.slow

TrialState = optuna.trial.TrialState
SMOKE = ("+experiment=bert_ffn", "debug=smoke", TWO_BACKENDS)
STUDY = "bert_ffn-smoke"
# Points per trained configuration: bert_ffn's backends that this machine runs.
BACKENDS = len(runnable_backends(*SMOKE))
# Fast heartbeats, so that a dead worker's trial goes stale within seconds.
QUICK_HEARTBEAT = ("study.heartbeat.interval=1", "study.heartbeat.grace_period=4")


class Worker:
    """One `python -m tuner` process whose output is collected as it runs."""

    def __init__(self, cwd: Path, storage: str, tracking: str, *overrides: str) -> None:
        command = [
            sys.executable,
            "-m",
            "tuner",
            *SMOKE,
            *overrides,
            f"study.storage={storage}",
            f"tracking.uri={tracking}",
            f"hydra.run.dir={cwd}/outputs",
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
        self.process = warm.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"worker never printed {text!r}:\n{self.output}")
            time.sleep(0.2)

    def finish(self, timeout: float = 600) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code


def _stores(postgres_database) -> tuple[str, str]:
    storage, tracking = postgres_database("optuna"), postgres_database("mlflow")
    # Build the MLflow schema once; workers starting together would race to migrate it.
    MlflowClient(tracking).search_experiments()
    return storage, tracking


def _own_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that trained a configuration (not the other backends' points)."""
    return [t for t in study.trials if t.user_attrs.get(TRAINED_IN_ATTR, t.number) == t.number]


def _assert_consistent(study: optuna.Study, tracking: str, trained: int) -> None:
    """Exactly `trained` complete configurations, each with one point per backend, and one
    finished MLflow run per point; nothing left running anywhere."""
    own_complete = [t for t in _own_trials(study) if t.state == TrialState.COMPLETE]
    assert len(own_complete) == trained
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == trained * BACKENDS
    assert len({t.number for t in study.trials}) == len(study.trials)
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    finished = [
        r for r in runs if r.data.tags.get(ROLE_TAG) == "trial" and r.info.status == "FINISHED"
    ]
    numbers = sorted(int(r.data.tags["optuna.trial_number"]) for r in finished)
    assert numbers == sorted(t.number for t in complete)


def _load(storage: str) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=storage)


def _run_workers(cwd: Path, storage: str, tracking: str, count: int, *overrides: str) -> None:
    workers = [Worker(cwd / f"w{index}", storage, tracking, *overrides) for index in range(count)]
    for worker in workers:
        assert worker.finish() == 0, worker.output


@pytest.fixture
def workdirs(tmp_path) -> Path:
    for index in range(3):
        (tmp_path / f"w{index}").mkdir()
    return tmp_path


def test_workers_share_n_trials_of_one_study(workdirs, postgres_database):
    storage, tracking = _stores(postgres_database)
    _run_workers(workdirs, storage, tracking, 3, "debug.overrides.study.n_trials=4")
    study = _load(storage)
    _assert_consistent(study, tracking, trained=4)
    # Three workers started together; one of them trained the study's distillation teacher,
    # once, and every trained student learnt from that one. (Workers that each queued a teacher
    # trial at the same moment leave the others skipped, unrun.)
    teachers = [t for t in study.trials if TEACHER_TRIAL_ATTR in t.system_attrs]
    (teacher,) = [t for t in teachers if DUPLICATE_ATTR not in t.system_attrs]
    assert all(t.state == TrialState.PRUNED and not t.params for t in teachers if t != teacher)
    assert teacher.state == TrialState.COMPLETE
    stored = study.user_attrs[STORED_TEACHERS_ATTR]["auto"]
    assert stored["trial"] == teacher.number
    client = MlflowClient(tracking)
    for trial in _own_trials(study):
        if trial.params.get("train.distill.alpha", 0) > 0:
            tags = client.get_run(trial.user_attrs["mlflow_run_id"]).data.tags
            assert tags[TEACHER_TAG] == stored["uri"]
    # Workers drew different configurations, not one seed's sequence each. (A worker that found
    # the budget spent between its check and its ask leaves a skipped trial without params.)
    drawn = [t for t in _own_trials(study) if SKIPPED_ATTR not in t.user_attrs]
    assert len(drawn) == 4
    assert len({tuple(sorted(t.params.items())) for t in drawn}) == len(drawn)
    # A later worker finds the budget spent and adds nothing.
    late = Worker(workdirs / "w0", storage, tracking, "debug.overrides.study.n_trials=4")
    assert late.finish() == 0
    assert "has its 4 trained configurations" in late.output
    assert len(_load(storage).trials) == len(study.trials)


def test_a_killed_worker_s_trial_is_failed_and_retried_by_another(workdirs, postgres_database):
    storage, tracking = _stores(postgres_database)
    total = "debug.overrides.study.n_trials=3"
    # The victim trains for long; it is killed while training its first configuration.
    victim = Worker(
        workdirs / "w0",
        storage,
        tracking,
        total,
        *QUICK_HEARTBEAT,
        "debug.overrides.train.epochs=200",
    )
    victim.wait_for("training step")
    survivor = Worker(workdirs / "w1", storage, tracking, total, *QUICK_HEARTBEAT)
    time.sleep(2)
    victim.process.send_signal(signal.SIGKILL)
    assert victim.finish() == -signal.SIGKILL
    assert survivor.finish() == 0, survivor.output
    assert "sent no heartbeat" in survivor.output

    study = _load(storage)
    failed = [t for t in _own_trials(study) if t.state == TrialState.FAIL]
    assert len(failed) == 1
    killed = failed[0]
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    # The configuration's params; the backend is decided once the model is deployed.
    assert {k: v for k, v in retries[0].params.items() if k != "deploy.backend"} == killed.params
    _assert_consistent_after_failure(study, tracking, trained=3, failed=killed)


def _assert_consistent_after_failure(study, tracking: str, trained: int, failed) -> None:
    own_complete = [t for t in _own_trials(study) if t.state == TrialState.COMPLETE]
    assert len(own_complete) == trained
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    dead = [r for r in runs if r.data.tags.get(TRAINED_IN_TAG) == str(failed.number)]
    assert dead and all(r.info.status in ("FAILED", "KILLED") for r in dead)
    assert all("heartbeat" in r.data.tags["failure_reason"] for r in dead)
    parents = [r for r in runs if r.data.tags.get(ROLE_TAG) == "study"]
    assert sorted(r.info.status for r in parents) == ["FINISHED", "KILLED"]


def test_workers_ride_out_a_postgresql_restart(workdirs, restartable_postgres_database):
    storage, tracking = _stores(restartable_postgres_database)
    # Trials that train for longer than the other worker takes to start and find the teacher
    # (it looks every heartbeat interval), so that both have trained when the database goes,
    # and are most likely training still.
    longer = (
        "debug.overrides.study.n_trials=4",
        "debug.overrides.train.epochs=3",
        "study.heartbeat.interval=2",
    )
    workers = [Worker(workdirs / f"w{i}", storage, tracking, *longer) for i in range(2)]
    for worker in workers:
        worker.wait_for("training step")
    postgres_control("restart", RESTARTED)
    for worker in workers:
        assert worker.finish() == 0, worker.output
    try:
        _assert_consistent(_load(storage), tracking, trained=4)
    except AssertionError:
        print("\n\n".join(worker.output for worker in workers))
        raise


def _drop_connection_on_insert(url: str, table: str, timeout: float = 300) -> str:
    """Hold off every write to `table` of the database at `url` (a SHARE lock lets reads by),
    then drop the connection of the first INSERT that waits on it, as a database restart
    would mid-call; returns that statement."""
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as holder, engine.connect() as watcher:
            holder.execute(sqlalchemy.text(f"LOCK TABLE {table} IN SHARE MODE"))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                waiting = watcher.execute(
                    sqlalchemy.text(
                        "SELECT pid, query FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock' AND pid <> "
                        "pg_backend_pid() AND query ILIKE :insert"
                    ),
                    {"insert": f"INSERT INTO {table}%"},
                ).first()
                watcher.rollback()
                if waiting is not None:
                    watcher.execute(sqlalchemy.text(f"SELECT pg_terminate_backend({waiting.pid})"))
                    holder.rollback()
                    return waiting.query
                time.sleep(0.1)
            pytest.fail(f"no INSERT INTO {table} waited within {timeout} s")
    finally:
        engine.dispose()


def test_a_trial_that_loses_the_database_on_a_write_never_repeated_is_queued_again(
    workdirs, postgres_database
):
    """The connection drops under the INSERT of a point's MLflow run, a write that is never
    repeated: the trial is not the configuration's fault. It is failed with that reason,
    queued again with its params, and the study still ends with every configuration trained."""
    storage, tracking = _stores(postgres_database)
    worker = Worker(workdirs / "w0", storage, tracking, "debug.overrides.study.n_trials=2")
    # The student's own run exists from here on: the next run made is a point's.
    worker.wait_for("Trial 2/2")
    worker.wait_for("training step")
    statement = _drop_connection_on_insert(tracking, "runs")
    assert worker.finish() == 0, worker.output
    assert "database was lost mid-trial" in worker.output, worker.output
    study = _load(storage)
    (lost,) = [t for t in _own_trials(study) if t.state == TrialState.FAIL]
    reason = lost.user_attrs[FAIL_REASON_ATTR]
    assert "database was lost mid-trial" in reason and "queued again" in reason, statement
    (retry,) = [t for t in study.trials if t.system_attrs.get("failed_trial") == lost.number]
    assert retry.state == TrialState.COMPLETE
    assert {k: v for k, v in retry.params.items() if k != "deploy.backend"} == lost.params
    # The lost trial's runs were closed with the reason; its points stay, and the retry
    # deployed only the backends that had none.
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(STUDY)
    lost_runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`tuner.trained_in_trial` = '{lost.number}'",
    )
    assert lost_runs and all(r.info.status != "RUNNING" for r in lost_runs)
    _assert_consistent(study, tracking, trained=2)


def test_sqlite_refuses_a_second_worker(tmp_path):
    storage, tracking = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    first = Worker(tmp_path, storage, tracking, "debug.overrides.train.epochs=200")
    try:
        first.wait_for("training step")
        second = Worker(tmp_path, storage, tracking)
        assert second.finish() == 2
        assert "SQLite is not safe for parallel Optuna writers" in second.output
        assert "postgresql+psycopg://" in second.output and "journal:///" in second.output
    finally:
        first.process.send_signal(signal.SIGTERM)
        first.finish()


@pytest.mark.parametrize(
    ("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_interrupted_trial_is_failed_queued_and_resumed(tmp_path, stop, code):
    storage, tracking = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    worker = Worker(
        tmp_path, storage, tracking, "debug.overrides.train.epochs=200", *QUICK_HEARTBEAT
    )
    worker.wait_for("training step")
    time.sleep(1)
    worker.process.send_signal(stop)
    assert worker.finish(timeout=120) == code, worker.output
    assert "re-run the same command to resume" in worker.output
    study = optuna.load_study(study_name=STUDY, storage=storage)
    interrupted, queued = study.trials
    assert interrupted.state == TrialState.FAIL and queued.state == TrialState.WAITING
    assert queued.params == interrupted.params
    client = MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name(STUDY).experiment_id])
    assert {r.info.status for r in runs} == {"KILLED"}

    # The same command (without the slow training) resumes with the queued configuration.
    again = Worker(tmp_path, storage, tracking, "debug.overrides.study.n_trials=1")
    assert again.finish() == 0, again.output
    study = optuna.load_study(study_name=STUDY, storage=storage)
    own = [t for t in _own_trials(study) if t.state == TrialState.COMPLETE]
    assert [t.number for t in own] == [queued.number]
    # The configuration's params; the backend is decided once the model is deployed.
    assert {k: v for k, v in own[0].params.items() if k != "deploy.backend"} == interrupted.params
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == BACKENDS


def test_a_stop_during_start_up_ends_cleanly_with_nothing_half_done(tmp_path):
    storage, tracking = f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/mlflow.db"
    worker = Worker(tmp_path, storage, tracking)
    # The study exists; the machine's peaks are being measured, no trial has started.
    worker.wait_for("Created study")
    worker.process.send_signal(signal.SIGTERM)
    assert worker.finish(timeout=120) == 143, worker.output
    assert "re-run the same command to resume" in worker.output
    study = optuna.load_study(study_name=STUDY, storage=storage)
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    # Resuming runs the study as if the stop had never happened.
    again = Worker(tmp_path, storage, tracking, "debug.overrides.study.n_trials=1")
    assert again.finish() == 0, again.output
    study = optuna.load_study(study_name=STUDY, storage=storage)
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) >= BACKENDS


def test_workers_started_together_with_the_default_tracking_store(workdirs, postgres_database):
    # Two workers on one PostgreSQL study, both in one working directory with the default
    # tracking.uri (SQLite mlflow.db there), which neither has created yet.
    storage = postgres_database("optuna")
    shared = workdirs / "w0"
    workers = [
        Worker(shared, storage, "sqlite:///mlflow.db", "debug.overrides.study.n_trials=2")
        for _ in range(2)
    ]
    for worker in workers:
        assert worker.finish() == 0, worker.output
    _assert_consistent(_load(storage), f"sqlite:///{shared}/mlflow.db", trained=2)

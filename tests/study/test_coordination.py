"""Faults that left workers waiting for ever, trained a second teacher or ran a trial twice:
real `python -m tuner` worker processes (`scripts/fault_worker.py`), real signals, SQLite files
and the private PostgreSQL server. Each study distils, so its teacher is trained in it."""

from __future__ import annotations

import sys

import pytest
import warm
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import fault_matrix  # noqa: E402

pytestmark = pytest.mark.slow
NOTHING_LOST = {"lost": 0, "twice": 0, "teachers": 1}
# The same, for a study that trains no teacher (`train.distill.alpha=0`).
NOTHING_LOST_NO_TEACHER = {"lost": 0, "twice": 0, "teachers": 0}


@pytest.fixture(autouse=True)
def warm_workers(monkeypatch):
    """The matrix's workers start warm (the MLflow server it starts does not)."""
    monkeypatch.setattr(fault_matrix, "subprocess", warm)


def _sqlite_cell(directory):
    url = f"sqlite:///{directory}/optuna.db"
    return fault_matrix.Cell("sqlite", url, f"sqlite:///{directory}/mlflow.db", directory, 400)


@pytest.fixture
def cell(storage_url, tmp_path):
    kind = storage_url.split(":", 1)[0].split("+", 1)[0]
    return fault_matrix.Cell(kind, storage_url, f"sqlite:///{tmp_path}/mlflow.db", tmp_path, 400)


def test_a_worker_killed_before_its_trial_s_first_heartbeat_leaves_nothing_waiting(cell):
    # Before: the trial stayed RUNNING without a heartbeat, never failed: on SQLite every resume
    # was refused ("another worker is running trial #1"); on PostgreSQL the next worker waited
    # for it for ever.
    assert fault_matrix._kill_after_create(cell)
    assert (cell.directory / "fault-struck").exists()
    assert fault_matrix.outcome(cell.url, cell.tracking) == NOTHING_LOST


def test_a_trial_created_just_before_its_connection_dropped_is_run_once(cell):
    # Before: the creation was retried, so a second trial was made and the first left RUNNING
    # without a heartbeat for ever.
    assert fault_matrix._drop_after_commit(cell)
    assert (cell.directory / "fault-struck").exists()
    assert fault_matrix.outcome(cell.url, cell.tracking) == NOTHING_LOST


def test_a_teacher_download_failing_once_trains_no_second_teacher(cell):
    # Before: any failure to download the stored teacher was read as "files gone": the record
    # was forgotten and a second teacher trained. Tracked on an MLflow server, so the teacher is
    # downloaded over HTTP.
    assert fault_matrix._teacher_fetch_fails(cell)
    assert (cell.directory / "fault-struck").exists()
    assert cell.counts == NOTHING_LOST


def test_a_worker_whose_trial_another_worker_failed_goes_on(tmp_path):
    # Before: telling the study a trial that another worker had failed as stale (its heartbeats
    # lapsed in a database outage) raised "Cannot tell a FAIL trial", and the worker crashed.
    import optuna

    from tuner.store.budget import retry_template

    cell = _sqlite_cell(tmp_path)
    worker = cell.worker("a", "none", "train.distill.alpha=0", "debug.overrides.train.epochs=5")
    assert worker.wait_for("training step", 300)
    storage = optuna.storages.RDBStorage(cell.url)
    study_id = storage.get_study_id_from_name(fault_matrix.STUDY)
    (running,) = storage.get_all_trials(study_id, states=(optuna.trial.TrialState.RUNNING,))
    # What another worker does to a trial it finds silent: fail it, queue its retry.
    storage.set_trial_state_values(running._trial_id, optuna.trial.TrialState.FAIL)
    storage.create_new_trial(study_id, template_trial=retry_template(running))
    assert cell.finish([worker]), "".join(worker.lines)
    assert "failed by another worker that found it silent" in "".join(worker.lines)
    assert fault_matrix.outcome(cell.url, cell.tracking) == NOTHING_LOST_NO_TEACHER


def test_a_sqlite_study_resumed_right_after_its_worker_was_killed_takes_its_trial(tmp_path):
    # Before: the resume was refused ("another worker is running trial #0") until the killed
    # worker's trial had been silent for the grace period.
    cell = _sqlite_cell(tmp_path)
    same = ("study.heartbeat.interval=1", "study.heartbeat.grace_period=15")
    same += ("train.distill.alpha=0", "debug.overrides.train.epochs=5")
    first = cell.worker("a", "none", *same)
    assert first.wait_for("training step", 300)
    first.process.kill()
    first.process.wait()
    second = cell.worker("b", "none", *same)
    assert cell.finish([second]), "".join(second.lines)
    # The killed worker's trial was failed once stale and run again by the second worker.
    assert "sent no heartbeat for 15 s" in "".join(second.lines)
    assert fault_matrix.outcome(cell.url, cell.tracking) == NOTHING_LOST_NO_TEACHER


def test_of_two_workers_started_together_on_one_sqlite_study_one_is_refused(tmp_path):
    # Before: both found no running trial, both ran, and both could claim one queued trial.
    cell = _sqlite_cell(tmp_path)
    workers = [cell.worker(name, "none", "train.distill.alpha=0") for name in ("a", "b")]
    assert cell.finish(workers, allowed=(0, 2))
    codes = sorted(worker.process.returncode for worker in workers)
    output = {worker.process.returncode: "".join(worker.lines) for worker in workers}
    assert codes == [0, 2], output
    assert "another worker is running this study" in output[2]
    assert fault_matrix.outcome(cell.url, cell.tracking) == NOTHING_LOST_NO_TEACHER

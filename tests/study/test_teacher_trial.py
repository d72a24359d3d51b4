"""Workers agree on the one trial that trains the study's teacher (`tuner.study.teacher_trial`): it
is queued once however many workers start together, a dead worker's attempt is queued again once,
and only a teacher confirmed gone is trained again. Real SQLite and PostgreSQL storages; the
training itself is replaced by storing a small real teacher, which is all the agreement sees."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import optuna
import pytest
import torch
import warm
from conftest import TINY_BERT

import tuner.study.teacher_trial
from tuner.errors import StudyStopped
from tuner.keys import STORED_TEACHERS_ATTR, TEACHER_TRIAL_ATTR
from tuner.models.recipe import ModelRecipe
from tuner.store.lease import Leases
from tuner.store.optuna_compat import stale_trial_ids, trial_id_of
from tuner.store.requeue import requeue
from tuner.store.storage import Heartbeat, open_storage
from tuner.study.teacher_trial import ensure_trained
from tuner.training import TrainResult
from tuner.trial import teacher as teacher_module
from tuner.trial.teacher import Teachers, record_stored, save_teacher

TrialState = optuna.trial.TrialState
LABELS = ["neg", "pos"]


def _teacher_files(directory: Path) -> Path:
    torch.manual_seed(0)
    recipe = ModelRecipe(TINY_BERT.model, len(LABELS))
    return save_teacher(recipe.build(), recipe, LABELS, directory / "teacher")


class _Study:
    """A study of `url` whose teacher (`auto`) workers agree on; `train` is what a worker's
    teacher trial does: store the teacher, complete."""

    def __init__(self, directory: Path, url: str, heartbeat: Heartbeat | None = None) -> None:
        self.url = url
        self.storage, _ = open_storage(url, heartbeat)
        self.study = optuna.create_study(
            storage=self.storage, study_name="race", directions=["maximize", "minimize"]
        )
        self.study_id = self.storage.get_study_id_from_name("race")
        self.files = str(_teacher_files(directory))
        self.tracking = f"sqlite:///{directory}/mlflow.db"
        self.trained: list[int] = []

    def train(self, trial: optuna.trial.FrozenTrial, storage=None) -> None:
        storage = storage or self.storage
        assert trial.state == TrialState.RUNNING
        self.trained.append(trial.number)
        record_stored(storage, self.study_id, "auto", trial.number, self.files, TrainResult())
        storage.set_trial_state_values(trial_id_of(trial), TrialState.COMPLETE, [0.8, 1.0])

    def teachers(self) -> Teachers:
        return Teachers("auto", self.tracking, LABELS, {"train.lr": 1e-3})

    def ensure(self, storage=None, run_trial=None, max_retry: int = 2) -> None:
        """One worker's `ensure_trained`, on a storage of its own if given."""
        storage = storage or self.storage
        ensure_trained(
            optuna.load_study(study_name="race", storage=storage),
            Leases(self.url, "race"),
            self.teachers(),
            run_trial or (lambda trial: self.train(trial, storage)),
            poll_seconds=0.05,
            max_retry=max_retry,
        )

    def states(self) -> list[tuple[int, TrialState]]:
        return [(t.number, t.state) for t in self.storage.get_all_trials(self.study_id)]

    def queue_attempt(self) -> None:
        template = optuna.trial.create_trial(
            state=TrialState.WAITING,
            system_attrs={TEACHER_TRIAL_ATTR: {"reference": "auto", "params": {"train.lr": 1e-3}}},
        )
        self.storage.create_new_trial(self.study_id, template_trial=template)

    def close(self) -> None:
        self.storage.remove_session()
        self.storage.inner.engine.dispose()


def _workers_together(race: _Study, workers: int) -> list[Exception]:
    """`ensure_trained` in `workers` threads released at one moment, each with a storage of
    its own (as worker processes have); the errors they raised."""
    storages = [open_storage(race.url)[0] for _ in range(workers)]
    start, errors = threading.Barrier(workers), []

    def worker(storage) -> None:
        try:
            start.wait()
            race.ensure(storage)
        except Exception as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(storage,)) for storage in storages]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for storage in storages:
        storage.remove_session()
        storage.inner.engine.dispose()
    return errors


def test_a_worker_queues_the_teacher_trial_and_trains_it(tmp_path):
    race = _Study(tmp_path, f"sqlite:///{tmp_path}/optuna.db")
    race.ensure()
    assert race.trained == [0] and race.states() == [(0, TrialState.COMPLETE)]
    # Stored: a second worker (or a resume) queues nothing and trains nothing.
    race.ensure()
    assert race.trained == [0] and race.states() == [(0, TrialState.COMPLETE)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workers_starting_together_on_postgresql_queue_one_teacher_trial(
    tmp_path, postgres_database
):
    # Three workers find no teacher trial at the same moment, round after round: each round
    # the study holds one teacher trial, trained once, and nothing else.
    for round_ in range(12):
        race = _Study(tmp_path / str(round_), postgres_database(str(round_)))
        errors = _workers_together(race, 3)
        assert not errors, (round_, errors)
        assert len(race.trained) == 1, (round_, race.states())
        assert race.states() == [(race.trained[0], TrialState.COMPLETE)], round_
        race.close()


_WORKER = """
import json, sys, time
from pathlib import Path
import optuna
import tuner.study.teacher_trial as agreement
from tuner.store.lease import Leases
from tuner.store.optuna_compat import trial_id_of
from tuner.store.storage import open_storage
from tuner.training import TrainResult
from tuner.trial.teacher import Teachers, record_stored

url, files, tracking, here, me, other = sys.argv[1:]
here = Path(here)
storage, _ = open_storage(url)
study_id = storage.get_study_id_from_name("race")
queue_attempt, waited = agreement._queue_attempt, []

def queue_once_both_looked(*args, **kwargs):
    # Both workers found no teacher trial before either queues one.
    if not waited:
        waited.append(me)
        (here / f"looked-{me}").write_text(me)
        while not (here / f"looked-{other}").exists():
            time.sleep(0.01)
    return queue_attempt(*args, **kwargs)

agreement._queue_attempt = queue_once_both_looked
trained = []

def train(trial):
    trained.append(trial.number)
    record_stored(storage, study_id, "auto", trial.number, files, TrainResult())
    storage.set_trial_state_values(
        trial_id_of(trial), optuna.trial.TrialState.COMPLETE, [0.8, 1.0]
    )

agreement.ensure_trained(
    optuna.load_study(study_name="race", storage=storage),
    Leases(url, "race"),
    Teachers("auto", tracking, ["neg", "pos"], {"train.lr": 1e-3}),
    train,
    poll_seconds=0.05,
    max_retry=2,
)
print(json.dumps(trained))
"""


@pytest.mark.slow
def test_two_worker_processes_that_both_find_no_teacher_trial_queue_and_train_one(
    tmp_path, postgres_database
):
    # Two processes on one storage; each, having found no teacher trial, waits to queue one
    # until the other has found none too: both decide on the same view of the study. On
    # PostgreSQL, where workers share a study: on SQLite (one worker) two processes can both
    # move the queued trial to RUNNING, as Optuna reads its state outside the transaction that
    # writes it there, and both train it.
    race = _Study(tmp_path, postgres_database("optuna"))
    workers = [
        warm.Popen(
            [sys.executable, "-c", _WORKER, race.url, race.files, race.tracking]
            + [str(tmp_path), me, other],
            stdout=subprocess.PIPE,
            text=True,
        )
        for me, other in (("a", "b"), ("b", "a"))
    ]
    outputs = [worker.communicate(timeout=240)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0]
    assert (tmp_path / "looked-a").exists() and (tmp_path / "looked-b").exists()
    # One teacher trial, queued by one of them and trained once, by one of them.
    trained = [json.loads(output.splitlines()[-1]) for output in outputs]
    assert sorted(trained) == [[], [0]]
    assert race.states() == [(0, TrialState.COMPLETE)]
    race.close()


def test_a_worker_waits_while_another_trains_the_teacher(tmp_path, monkeypatch):
    race = _Study(tmp_path, f"sqlite:///{tmp_path}/optuna.db")
    race.queue_attempt()
    (attempt,) = race.storage.get_all_trials(race.study_id)
    assert race.storage.set_trial_state_values(trial_id_of(attempt), TrialState.RUNNING)
    seen = []

    def other_worker_finishes(seconds: float) -> None:
        seen.append(race.states())
        race.train(race.storage.get_trial(trial_id_of(attempt)))

    monkeypatch.setattr(tuner.study.teacher_trial.time, "sleep", other_worker_finishes)
    race.ensure(run_trial=lambda trial: pytest.fail("the running attempt is not this worker's"))
    assert seen == [[(0, TrialState.RUNNING)]]
    assert race.trained == [0] and race.states() == [(0, TrialState.COMPLETE)]


def test_an_attempt_whose_worker_died_is_queued_again_once(tmp_path):
    race = _Study(tmp_path, f"sqlite:///{tmp_path}/optuna.db")
    race.queue_attempt()
    (attempt,) = race.storage.get_all_trials(race.study_id)
    # Its worker died: another one failed it as stale (without a reason of tuner's own).
    race.storage.set_trial_state_values(trial_id_of(attempt), TrialState.RUNNING)
    race.storage.set_trial_state_values(trial_id_of(attempt), TrialState.FAIL)
    failed = race.storage.get_trial(trial_id_of(attempt))
    leases = Leases(race.url, "race")
    # The worker that found it stale and this one both ask for its retry: one is queued.
    assert requeue(leases, race.storage, race.study_id, failed, max_retry=2)
    race.ensure()
    assert race.trained == [1]
    assert race.states() == [(0, TrialState.FAIL), (1, TrialState.COMPLETE)]


def test_an_attempt_whose_worker_died_too_often_stops_the_study(tmp_path):
    race = _Study(tmp_path, f"sqlite:///{tmp_path}/optuna.db")

    def worker_dies(trial: optuna.trial.FrozenTrial) -> None:
        race.storage.set_trial_state_values(trial_id_of(trial), TrialState.FAIL)

    with pytest.raises(StudyStopped, match=r"trial #2\) did not train: its worker died 3 times"):
        race.ensure(run_trial=worker_dies, max_retry=2)
    assert race.states() == [(n, TrialState.FAIL) for n in range(3)]


def test_a_claimed_teacher_trial_goes_stale_if_its_worker_dies_before_it_beats(tmp_path):
    race = _Study(tmp_path, f"sqlite:///{tmp_path}/optuna.db", Heartbeat(1, 1))
    found_stale = []

    def dies_before_beating(trial: optuna.trial.FrozenTrial) -> None:
        time.sleep(2.5)
        found_stale.append(trial_id_of(trial) in stale_trial_ids(race.storage, race.study_id))
        race.train(trial)

    race.ensure(run_trial=dies_before_beating)
    assert found_stale == [True]


def _stored_in_mlflow(race: _Study, directory: Path) -> str:
    """The teacher logged as an artifact of an MLflow run whose artifacts live in `directory`;
    its `runs:/` URI recorded as the study's teacher."""
    client = mlflow.MlflowClient(race.tracking)
    experiment = client.create_experiment("teachers", artifact_location=directory.as_uri())
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, race.files, "teacher")
    uri = f"runs:/{run.info.run_id}/teacher"
    record_stored(race.storage, race.study_id, "auto", 0, uri, TrainResult())
    return uri


def test_a_teacher_confirmed_gone_is_trained_again_once(tmp_path):
    race = _Study(tmp_path, f"sqlite:///{tmp_path}/optuna.db")
    race.queue_attempt()
    (first,) = race.storage.get_all_trials(race.study_id)
    race.storage.set_trial_state_values(trial_id_of(first), TrialState.RUNNING)
    race.storage.set_trial_state_values(trial_id_of(first), TrialState.COMPLETE, [0.8, 1.0])
    root = tmp_path / "artifacts"
    uri = _stored_in_mlflow(race, root)
    # The run's artifact directory is there, its teacher is not.
    for path in sorted(root.rglob("teacher.safetensors")):
        path.unlink()
    race.ensure()
    assert race.trained == [1]
    assert race.states() == [(0, TrialState.COMPLETE), (1, TrialState.COMPLETE)]
    assert (
        race.storage.get_study_user_attrs(race.study_id)[STORED_TEACHERS_ATTR]["auto"]["uri"] != uri
    )


def test_a_teacher_that_cannot_be_fetched_is_not_trained_again(tmp_path, monkeypatch):
    monkeypatch.setattr(teacher_module, "FETCH_SECONDS", 1.5)
    race = _Study(tmp_path, f"sqlite:///{tmp_path}/optuna.db")
    root = tmp_path / "another-host"
    uri = _stored_in_mlflow(race, root)
    # A `file://` artifact root that this host cannot see: nothing says the teacher is gone.
    root.rename(tmp_path / "elsewhere")
    with pytest.raises(StudyStopped, match="cannot be fetched"):
        race.ensure(run_trial=lambda trial: pytest.fail("trained a second teacher"))
    assert (
        race.storage.get_study_user_attrs(race.study_id)[STORED_TEACHERS_ATTR]["auto"]["uri"] == uri
    )
    assert race.states() == []

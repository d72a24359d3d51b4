"""The study's storage (`tuner.store.storage`): only calls that are safe to repeat are retried, and
a running trial whose worker died before its first heartbeat goes stale. Real SQLite storages;
the lost connection is an error raised after the real call, as a connection that drops after its
commit gives."""

from __future__ import annotations

import time

import optuna
import pytest
import sqlalchemy.exc

from tuner.store import retries
from tuner.store.optuna_compat import trial_id_of
from tuner.store.storage import Heartbeat, open_storage

TrialState = optuna.trial.TrialState


def _dropped() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("...", {}, Exception("server closed the connection"))


def _committed_then_dropped(method):
    """`method`, whose first call is done and then answers with a dropped connection."""
    calls = []

    def call(*args, **kwargs):
        calls.append(args)
        result = method(*args, **kwargs)
        if len(calls) == 1:
            raise _dropped()
        return result

    return call, calls


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.setattr(retries, "_FIRST_WAIT", 0.0)  # retried at once
    storage, _ = open_storage(f"sqlite:///{tmp_path}/optuna.db", Heartbeat(1, 2))
    return optuna.create_study(storage=storage, study_name="s")


def test_creating_a_trial_is_not_retried_after_a_dropped_connection(study):
    storage = study._storage
    storage.inner.create_new_trial, calls = _committed_then_dropped(storage.inner.create_new_trial)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        storage.create_new_trial(study._study_id)
    # Repeated, it would have made a second trial: one running trial that nobody runs.
    assert len(calls) == 1 and len(study.get_trials()) == 1


def test_reads_and_attributes_are_retried(study):
    storage = study._storage
    trial_id = storage.create_new_trial(study._study_id)
    storage.inner.set_trial_user_attr, calls = _committed_then_dropped(
        storage.inner.set_trial_user_attr
    )
    storage.set_trial_user_attr(trial_id, "k", 1)
    storage.inner.get_trial, reads = _committed_then_dropped(storage.inner.get_trial)
    assert storage.get_trial(trial_id).user_attrs == {"k": 1}
    assert len(calls) == 2 and len(reads) == 2


def test_finishing_a_trial_whose_first_attempt_was_committed_is_done(study):
    storage = study._storage
    trial_id = storage.create_new_trial(study._study_id)
    storage.inner.set_trial_state_values, calls = _committed_then_dropped(
        storage.inner.set_trial_state_values
    )
    # The repeat finds it complete already (Optuna raises for a finished trial): done.
    assert storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [1.0])
    assert len(calls) == 2 and study.get_trials()[0].state == TrialState.COMPLETE


def test_claiming_a_trial_is_not_retried(study):
    storage = study._storage
    study.enqueue_trial({})
    (waiting,) = study.get_trials()
    storage.inner.set_trial_state_values, calls = _committed_then_dropped(
        storage.inner.set_trial_state_values
    )
    with pytest.raises(sqlalchemy.exc.OperationalError):
        storage.set_trial_state_values(trial_id_of(waiting), TrialState.RUNNING)
    assert len(calls) == 1


def test_a_trial_whose_worker_died_before_its_first_heartbeat_goes_stale(study):
    storage = study._storage
    # Made as `study.ask` makes it; its worker died before its heartbeat thread started.
    orphan = storage.create_new_trial(study._study_id)
    assert storage._get_stale_trial_ids(study._study_id) == []
    # Grace period 2 s; SQLite's clock counts whole seconds, so 3 of them pass for sure.
    time.sleep(3.1)
    young = storage.create_new_trial(study._study_id)
    assert storage._get_stale_trial_ids(study._study_id) == [orphan]
    optuna.storages.fail_stale_trials(study)
    states = {t._trial_id: t.state for t in study.get_trials()}
    assert states == {orphan: TrialState.FAIL, young: TrialState.RUNNING}


@pytest.mark.parametrize("storage_class", ["optuna", "tuner"])
def test_a_commit_whose_answer_is_lost_makes_one_trial(tmp_path, monkeypatch, storage_class):
    # Optuna's own RDB storage tries a trial's creation five times when its commit fails, so a
    # commit that the database made but whose answer was lost makes a second trial.
    from sqlalchemy.orm import Session

    url = f"sqlite:///{tmp_path}/optuna.db"
    if storage_class == "tuner":
        storage, _ = open_storage(url, Heartbeat(1, 2))
    else:
        storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="s")
    commit, dropped = Session.commit, []

    def commit_then_drop(self):
        commit(self)
        if not dropped:
            dropped.append(True)
            raise _dropped()

    monkeypatch.setattr(Session, "commit", commit_then_drop)
    try:
        storage.create_new_trial(study._study_id)
    except optuna.exceptions.StorageInternalError:
        pass
    monkeypatch.undo()
    made = len(optuna.load_study(study_name="s", storage=url).trials)
    assert made == (1 if storage_class == "tuner" else 2)

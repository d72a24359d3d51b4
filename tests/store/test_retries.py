"""Transient database errors are retried; anything else fails at once."""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy.exc
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

from tuner.store import retries
from tuner.store.storage import RetryingStorage, open_storage


def _dropped_connection() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError(
        "SELECT 1", {}, Exception("server closed the connection")
    )


class Flaky:
    """Fails with `error` the first `failures` calls, then answers."""

    def __init__(self, error: Exception, failures: int) -> None:
        self.error, self.failures, self.calls = error, failures, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "answer"


def test_transient_errors_are_retried_until_the_call_succeeds(monkeypatch):
    monkeypatch.setattr(retries.time, "sleep", lambda seconds: None)
    flaky = Flaky(_dropped_connection(), failures=3)
    assert retries.call_with_retries(flaky) == "answer" and flaky.calls == 4


def test_mlflow_reports_of_an_unavailable_database_are_transient(monkeypatch):
    monkeypatch.setattr(retries.time, "sleep", lambda seconds: None)
    # What MLflow's SQL store raises when SQLAlchemy reports an OperationalError.
    error = MlflowException("database gone", error_code=TEMPORARILY_UNAVAILABLE)
    flaky = Flaky(error, failures=1)
    assert retries.call_with_retries(flaky) == "answer"


def test_optuna_s_wrapped_errors_are_recognised_through_their_cause():
    try:
        try:
            raise _dropped_connection()
        except sqlalchemy.exc.OperationalError as cause:
            raise optuna.exceptions.StorageInternalError("storage failed") from cause
    except optuna.exceptions.StorageInternalError as error:
        assert retries.is_transient(error)


def test_a_query_in_a_transaction_broken_by_a_restart_is_retried():
    # What Optuna's RDB storage raises when the server restarts under `get_all_trials`: its
    # fallback query runs in the session the dropped connection invalidated.
    try:
        try:
            raise _dropped_connection()
        except sqlalchemy.exc.OperationalError:
            try:
                raise sqlalchemy.exc.PendingRollbackError("Can't reconnect until rolled back")
            except sqlalchemy.exc.PendingRollbackError as cause:
                raise optuna.exceptions.StorageInternalError("commit failed") from cause
    except optuna.exceptions.StorageInternalError as error:
        assert retries.is_transient(error)


def test_other_errors_are_not_retried():
    flaky = Flaky(ValueError("bad value"), failures=1)
    with pytest.raises(ValueError):
        retries.call_with_retries(flaky)
    assert flaky.calls == 1
    assert not retries.is_transient(sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("dup")))


def test_retrying_gives_up_at_its_deadline(monkeypatch):
    monkeypatch.setattr(retries.time, "sleep", lambda seconds: None)
    flaky = Flaky(_dropped_connection(), failures=10**6)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        retries.call_with_retries(flaky, seconds=0.0)


def test_the_retrying_storage_is_a_complete_optuna_storage(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    storage, names = open_storage(url)
    assert isinstance(storage, RetryingStorage) and names == []
    study = optuna.create_study(storage=storage, study_name="s", directions=["maximize"])
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=3)
    assert (
        len(optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/optuna.db").trials)
        == 3
    )


def test_journal_file_storage_opens_for_parallel_workers_without_a_server(tmp_path):
    url = f"journal:///{tmp_path}/study.log"
    storage, names = open_storage(url)
    assert names == []
    study = optuna.create_study(storage=storage, study_name="s", directions=["maximize"])
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    assert len(open_storage(url)[0].get_all_trials(study._study_id)) == 2

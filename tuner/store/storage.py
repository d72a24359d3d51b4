"""Opening the Optuna storage named by `study.storage`.

RDB storages (SQLite, PostgreSQL, MySQL) are opened with heartbeats, so the trial of a worker
that died (SIGKILL, a lost machine) is failed `study.heartbeat.grace_period` seconds after its
last heartbeat, by the next worker that starts a trial, and handed to `on_stale` (which queues it
again). A trial has its first heartbeat from the moment it runs (`SingleAttemptRDBStorage`), and
staleness is read off the database's clock: no two hosts' clocks are compared.

Only calls that are safe to repeat are retried on transient errors (`tuner.store.retries`): reads,
heartbeats, attributes and params (the same value written twice is one write) and finishing a
trial (a repeat that finds it finished in that state is done). Creating a trial or claiming one
is not retried, by tuner or by Optuna (`SingleAttemptRDBStorage`): done twice it would leave a
trial no worker runs. Such a write fails its caller, and what it may have left is found stale
like any dead worker's trial. Heartbeats are retried for `grace_period - interval` seconds, so
an outage shorter than that fails no live trial; one that still fails is skipped, not fatal to
the heartbeat thread, and the next beat tries again.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna
import sqlalchemy.exc
from omegaconf import DictConfig
from optuna.storages import BaseStorage, RDBStorage

from tuner.errors import ConfigError
from tuner.secrets import mask_urls_in
from tuner.store.optuna_compat import (
    BaseHeartbeat,
    SingleAttemptRDBStorage,
    unbeaten_trial_ids,
)
from tuner.store.retries import RETRY_SECONDS, call_with_retries, is_transient

StaleCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]
_RDB_SCHEMES = ("sqlite", "postgresql", "mysql", "oracle", "mssql")
# `journal:///abs/path.log` (or `journal://rel/path.log`): Optuna's journal file storage.
JOURNAL_PREFIX = "journal://"


@dataclass(frozen=True)
class Heartbeat:
    """Seconds between a running trial's heartbeats, and of silence before it counts as dead."""

    interval: int
    grace_period: int

    @classmethod
    def from_config(cls, heartbeat_cfg: DictConfig) -> Heartbeat:
        return cls(int(heartbeat_cfg.interval), int(heartbeat_cfg.grace_period))


def is_rdb(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in _RDB_SCHEMES


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


class RetryingStorage(BaseStorage, BaseHeartbeat):
    """An RDB storage whose calls that are safe to repeat are retried on transient errors."""

    def __init__(self, inner: RDBStorage, grace_period: int | None = None) -> None:
        self.inner = inner
        interval = inner.get_heartbeat_interval() or 0
        # Past this a live trial may already be failed as stale by another worker.
        self.retry_seconds = (
            RETRY_SECONDS if grace_period is None else max(grace_period - interval, 1)
        )

    def __getattr__(self, name: str):
        # Anything not forwarded below (private helpers Optuna may use) goes to the storage.
        return getattr(self.inner, name)

    def set_trial_state_values(self, trial_id, state, values=None) -> bool:
        if not state.is_finished():
            # A claim (WAITING to RUNNING) repeated after its first attempt was committed would
            # find the trial running and report the claim lost: nobody would run it.
            return self.inner.set_trial_state_values(trial_id, state, values)
        tried = False

        def finish() -> bool:
            nonlocal tried
            repeat, tried = tried, True
            try:
                return self.inner.set_trial_state_values(trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                # The first attempt was committed before its connection dropped.
                if repeat and self.inner.get_trial(trial_id).state == state:
                    return True
                raise

        return call_with_retries(finish, seconds=self.retry_seconds)

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            call_with_retries(self.inner.record_heartbeat, trial_id, seconds=self.retry_seconds)
        except Exception as error:
            # Raised, it would end Optuna's heartbeat thread for good; the next beat tries again.
            if not is_transient(error):
                raise


def _retried(name: str):
    def method(self: RetryingStorage, *args, **kwargs):
        return call_with_retries(
            getattr(self.inner, name), *args, seconds=self.retry_seconds, **kwargs
        )

    method.__name__ = name
    return method


def _once(name: str):
    def method(self: RetryingStorage, *args, **kwargs):
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = name
    return method


def _safe_to_repeat(name: str) -> bool:
    return name.startswith(("get_", "check_")) or name in (
        "_get_stale_trial_ids",
        "record_heartbeat",
        "set_study_user_attr",
        "set_study_system_attr",
        "set_trial_user_attr",
        "set_trial_system_attr",
        "set_trial_param",
        "set_trial_intermediate_value",
        "remove_session",
    )


for _name in sorted(
    set(BaseStorage.__abstractmethods__)
    | set(BaseHeartbeat.__abstractmethods__)
    | {n for n in vars(BaseStorage) if not n.startswith("_") and callable(vars(BaseStorage)[n])}
):
    if _name not in vars(RetryingStorage):
        setattr(RetryingStorage, _name, (_retried if _safe_to_repeat(_name) else _once)(_name))
abc.update_abstractmethods(RetryingStorage)


def _rdb_storage(
    url: str, heartbeat: Heartbeat | None, on_stale: StaleCallback | None
) -> RetryingStorage:
    # Workers that open an empty database at the same moment race to create Optuna's tables;
    # the loser finds them made on its next attempt.
    for attempt in range(3):
        try:
            inner = SingleAttemptRDBStorage(
                url,
                engine_kwargs={"pool_pre_ping": True},
                heartbeat_interval=heartbeat.interval if heartbeat else None,
                grace_period=heartbeat.grace_period if heartbeat else None,
                heartbeat_stale_trial_callback=on_stale,
            )
            return RetryingStorage(inner, heartbeat.grace_period if heartbeat else None)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == 2:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def _journal_storage(path: str) -> BaseStorage:
    from optuna.storages.journal import JournalFileBackend

    # Optuna's append-only log file: parallel writers need no server, but it has no
    # heartbeats, so a dead worker's trial stays RUNNING until it is failed by hand.
    return optuna.storages.JournalStorage(JournalFileBackend(path))


def open_storage(
    url: str, heartbeat: Heartbeat | None = None, on_stale: StaleCallback | None = None
) -> tuple[BaseStorage, list[str]]:
    """The storage and the names of the studies it holds."""
    try:
        if is_rdb(url):
            storage: BaseStorage = _rdb_storage(url, heartbeat, on_stale)
        elif url.startswith(JOURNAL_PREFIX):
            storage = _journal_storage(url.removeprefix(JOURNAL_PREFIX))
        else:
            storage = optuna.storages.get_storage(url)
        names = [s.study_name for s in storage.get_all_studies()]
    except Exception as exc:
        # The driver's message may quote the URL too.
        raise ConfigError(
            mask_urls_in(f"Invalid config: key 'study.storage': cannot open {url}: {exc}")
        ) from None
    return storage, names


def beat_for_unbeaten(storage: BaseStorage, study_id: int) -> None:
    """Give a running trial without a heartbeat one now, so that it goes stale a grace period
    later unless a worker runs it: an earlier version of tuner made trials without one, and
    such a trial of a worker that died was never failed."""
    if isinstance(storage, RetryingStorage) and storage.inner.get_heartbeat_interval():
        unbeaten = call_with_retries(
            unbeaten_trial_ids, storage.inner, study_id, seconds=storage.retry_seconds
        )
        for trial_id in unbeaten:
            storage.record_heartbeat(trial_id)

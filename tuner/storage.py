"""Opening the Optuna storage named by `study.storage`.

RDB storages (SQLite, PostgreSQL, MySQL) are opened with heartbeats, so the trial of a worker
that died (SIGKILL, a lost machine) is failed `study.heartbeat.grace_period` seconds after its
last heartbeat, by the next worker that starts a trial, and handed to `on_stale` (which queues it
again). Their connections are pre-pinged and every call is retried on transient errors
(`tuner.retries`), so a database restart does not kill a worker.
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
from tuner.optuna_compat import BaseHeartbeat, stale_trial_ids, trial_id_of
from tuner.retries import call_with_retries
from tuner.secrets import mask_urls_in

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
    """An RDB storage whose every call is retried on transient database errors."""

    def __init__(self, inner: RDBStorage) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        # Anything not forwarded below (private helpers Optuna may use) goes to the storage.
        return getattr(self.inner, name)


def _forward(name: str):
    def method(self: RetryingStorage, *args, **kwargs):
        return call_with_retries(getattr(self.inner, name), *args, **kwargs)

    method.__name__ = name
    return method


for _name in sorted(
    set(BaseStorage.__abstractmethods__)
    | set(BaseHeartbeat.__abstractmethods__)
    | {n for n in vars(BaseStorage) if not n.startswith("_") and callable(vars(BaseStorage)[n])}
):
    setattr(RetryingStorage, _name, _forward(_name))
abc.update_abstractmethods(RetryingStorage)


def _rdb_storage(
    url: str, heartbeat: Heartbeat | None, on_stale: StaleCallback | None
) -> RetryingStorage:
    # Workers that open an empty database at the same moment race to create Optuna's tables;
    # the loser finds them made on its next attempt.
    for attempt in range(3):
        try:
            inner = RDBStorage(
                url,
                engine_kwargs={"pool_pre_ping": True},
                heartbeat_interval=heartbeat.interval if heartbeat else None,
                grace_period=heartbeat.grace_period if heartbeat else None,
                heartbeat_stale_trial_callback=on_stale,
            )
            return RetryingStorage(inner)
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


def live_trial_numbers(storage: BaseStorage, study_id: int) -> list[int]:
    """Running trials whose worker still sends heartbeats (all running ones without them)."""
    running = storage.get_all_trials(
        study_id, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)
    )
    stale: set[int] = set()
    if isinstance(storage, RetryingStorage) and storage.inner.get_heartbeat_interval():
        stale = set(stale_trial_ids(storage.inner, study_id))
    return [t.number for t in running if trial_id_of(t) not in stale]

"""Riding out transient database errors: a dropped connection or a restarting server.

Both stores sit on SQLAlchemy (Optuna's RDB storage, MLflow's tracking store). Connections are
pre-pinged when taken from the pool, and a call that is safe to repeat (a read, a heartbeat, an
attribute, a tag or metric, finishing a trial) and still fails with a connection-level error is
repeated with backoff until a deadline, so a worker survives a database restart instead of
losing its trial. A call that is not safe to repeat (creating a trial, a run) is never retried:
cut off after its commit, a repeat would make a second one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy.exc

from tuner.console import console

T = TypeVar("T")

RETRY_SECONDS = 180.0
_FIRST_WAIT, _LONGEST_WAIT = 0.5, 8.0


def is_transient(error: BaseException) -> bool:
    """Connection-level failures that a later attempt can get past."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        if isinstance(seen, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
            return True
        # A query retried in a transaction the lost connection broke (Optuna falls back to a
        # second query in the same session); the session is rolled back, a new call starts
        # clean.
        if isinstance(seen, sqlalchemy.exc.PendingRollbackError):
            return True
        # MLflow's SQL store reports SQLAlchemy's OperationalError under this code.
        if getattr(seen, "error_code", None) == "TEMPORARILY_UNAVAILABLE":
            return True
        # Optuna wraps a failed commit in StorageInternalError, raised from it.
        seen = seen.__cause__ or seen.__context__
    return False


def error_line(error: BaseException) -> str:
    """A database error in one line: its type and the first 200 characters of its first line
    (drivers append the failed SQL and its parameters after it)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def call_with_retries(
    function: Callable[..., T], *args: Any, seconds: float = RETRY_SECONDS, **kwargs: Any
) -> T:
    deadline = time.monotonic() + seconds
    wait = _FIRST_WAIT
    while True:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            if not is_transient(error) or time.monotonic() + wait > deadline:
                raise
            if wait == _FIRST_WAIT:  # said once, at the first retry
                database_retry(getattr(function, "__name__", "call"), error_line(error), seconds)
            time.sleep(wait)
            wait = min(wait * 2, _LONGEST_WAIT)


class RetryingProxy:
    """Every method of the wrapped MLflow client that is safe to repeat, retried on transient
    database errors. Creating a run or a logged model is not: one cut off after its commit and
    repeated would leave a second one; it fails its caller instead. (An experiment made twice
    is refused by name, which `Tracker` takes as made.)"""

    _ONCE = frozenset({"create_run", "create_logged_model"})

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._wrapped, name)
        if callable(value) and name not in self._ONCE:
            return functools.partial(call_with_retries, value)
        return value


def database_retry(operation: str, error: str, seconds: float) -> None:
    console.print(
        f"  [yellow]database unavailable during {operation} ({error}); retrying for up to "
        f"{seconds:.0f} s[/]"
    )

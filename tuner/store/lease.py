"""Mutual exclusion between the workers of one study: the one lease that coordination uses.

A lease is held by a live connection or an open file, never by a record with a time in it, so
it is exclusive however the workers' clocks differ, and it ends with its holder: released on
exit, or by the database or the kernel when the holder's process dies. Nothing is left behind.

- PostgreSQL: a session advisory lock (`pg_try_advisory_lock`) on a connection of its own.
- MySQL: `GET_LOCK` on a connection of its own.
- SQLite and Optuna's journal file: `flock` on a lock file beside it, one per purpose
  (`optuna.db.front.lock`). Never on the storage file itself: closing any descriptor of a file
  drops the POSIX locks this process holds on it, SQLite's own among them, and where `flock` is
  emulated by POSIX locks (NFS) the journal's own opening and closing would drop the lease.
  The lock files stay, empty, for the next holder.
- In-memory storages live in one process, one worker: there is no one to exclude.
"""

from __future__ import annotations

import fcntl
import time
import zlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy
from sqlalchemy.engine import make_url

# Tried again this often while another worker holds the lease: a blocking wait inside the
# database driver would not see Ctrl-C.
_POLL_SECONDS = 0.2


class LeaseHeld(Exception):
    """Another worker holds the lease asked for without waiting."""


@contextmanager
def _advisory(url: str, scope: str, wait: bool) -> Iterator[None]:
    # TCP keepalives: a holder whose machine vanished without closing its connection frees the
    # lease in minutes, not the system's default two hours.
    keepalives = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10}
    engine = sqlalchemy.create_engine(
        url,
        poolclass=sqlalchemy.pool.NullPool,
        connect_args=keepalives if url.startswith("postgresql") else {},
    )
    mysql = engine.dialect.name == "mysql"
    acquire = "SELECT GET_LOCK(:k, 0)" if mysql else "SELECT pg_try_advisory_lock(:k)"
    key: int | str = (
        f"tuner:{zlib.crc32(scope.encode()):08x}" if mysql else zlib.crc32(scope.encode())
    )
    # Without a pool, the connection closes when the block ends (the lease with it), as it does
    # when it is lost or its holder dies.
    with engine.connect() as connection:
        while not connection.execute(sqlalchemy.text(acquire), {"k": key}).scalar():
            if not wait:
                raise LeaseHeld(scope)
            connection.rollback()
            time.sleep(_POLL_SECONDS)
        connection.commit()
        yield


@contextmanager
def _file_lock(path: Path, wait: bool) -> Iterator[None]:
    # Per open file: two opens of one file exclude each other, in one process too. A blocking
    # wait here still sees Ctrl-C.
    with open(path, "ab") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LeaseHeld(str(path)) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _file_of(url: str) -> Path | None:
    """The file a SQLite or journal storage URL names; None for an in-memory one, or a URL that
    names none."""
    if url.startswith("journal://"):
        return Path(url.removeprefix("journal://"))
    try:
        database = make_url(url).database
    except sqlalchemy.exc.ArgumentError:
        return None  # refused when the storage opens
    return None if database in (None, "", ":memory:") else Path(database)


@dataclass(frozen=True)
class Leases:
    """The leases of one study in the storage at `url` (an Optuna storage URL), one per purpose
    (`what`). A holder does not take again a lease it holds: it would wait for itself."""

    url: str
    study: str

    def hold(self, what: str, wait: bool = True) -> AbstractContextManager[None]:
        """Hold `what` until the block ends; waits while another worker holds it, or raises
        `LeaseHeld` at once if not `wait`."""
        if self.url.startswith(("postgresql", "mysql")):
            return _advisory(self.url, f"tuner:{self.study}:{what}", wait)
        path = _file_of(self.url) if self.url.startswith(("sqlite", "journal://")) else None
        # A file the storage cannot make either (no such directory) is refused when it opens.
        if path is None or not path.parent.is_dir():
            return nullcontext()
        return _file_lock(path.with_name(f"{path.name}.{what}.lock"), wait)

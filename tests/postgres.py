"""The private PostgreSQL servers of the multi-worker tests (`scripts/postgres.sh`): the one they
share, and one of its own for the test that restarts its server under its workers, so that the
tests running beside it in the other process keep theirs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

POSTGRES_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "postgres.sh"


# The restarted server's data directory and port (the shared one's are postgres.sh's defaults).
RESTARTED = {"TUNER_PGDATA": "/tmp/tuner-postgres-restarted", "TUNER_PGPORT": "55433"}


def postgres_control(action: str, server: dict[str, str] | None = None) -> str:
    """Run scripts/postgres.sh (start, stop, restart, url) on the shared server, or the one
    `server` names, and return what it printed."""
    result = subprocess.run(
        ["bash", str(POSTGRES_SCRIPT), action],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(server or {})},
    )
    if result.returncode != 0:
        pytest.fail(
            f"scripts/postgres.sh {action} failed (Debian package `postgresql` needed; "
            f".ci/run installs it):\n{result.stderr}",
            pytrace=False,
        )
    return result.stdout.strip()


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """A real PostgreSQL server on 127.0.0.1; the base URL without a database name."""
    postgres_control("start")
    return postgres_control("url")


def _databases(server: str, request) -> Iterator[Callable[[str], str]]:
    """Fresh databases on `server` for one test, dropped after it: name -> URL."""
    import sqlalchemy

    # No pooled connections: a test may restart the server under them.
    admin = sqlalchemy.create_engine(
        f"{server}/postgres", isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool
    )
    created = []

    def create(name: str) -> str:
        database = f"t_{request.node.name[:40].lower()}_{name}".replace("[", "_").replace("]", "")
        with admin.connect() as connection:
            connection.execute(
                sqlalchemy.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            )
            connection.execute(sqlalchemy.text(f'CREATE DATABASE "{database}"'))
        created.append(database)
        return f"{server}/{database}"

    yield create
    with admin.connect() as connection:
        for database in created:
            connection.execute(
                sqlalchemy.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            )
    admin.dispose()


@pytest.fixture
def postgres_database(postgres_server, request) -> Iterator[Callable[[str], str]]:
    """Creates fresh databases on the shared server for one test; returns name -> URL."""
    yield from _databases(postgres_server, request)


@pytest.fixture
def restartable_postgres_database(request) -> Iterator[Callable[[str], str]]:
    """As `postgres_database`, on a server of the test's own, which it restarts with
    `postgres_control("restart", RESTARTED)`; stopped after the test."""
    postgres_control("start", RESTARTED)
    try:
        yield from _databases(postgres_control("url", RESTARTED), request)
    finally:
        postgres_control("stop", RESTARTED)


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path) -> str:
    """A fresh Optuna storage URL of each kind workers share a study on: a SQLite file, and a
    database of the private PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/optuna.db"
    return request.getfixturevalue("postgres_database")("optuna")

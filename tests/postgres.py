"""The private PostgreSQL server the multi-worker tests share (`scripts/postgres.sh`): its
fixtures, and the rule that keeps its tests in one process of a parallel run (pytest-xdist's
`loadgroup`), one after the other: one of them restarts the server under the others."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

GROUP = "postgresql"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A pytest hook (conftest imports it): every test that reaches the server, through its
    fixtures or as the `postgresql` case of `storage_url`, joins one group."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "postgres_server" in item.fixturenames or params.get("storage_url") == "postgresql":
            item.add_marker(pytest.mark.xdist_group(GROUP))


POSTGRES_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "postgres.sh"


def postgres_control(action: str) -> str:
    """Run scripts/postgres.sh (start, restart, url) and return what it printed."""
    result = subprocess.run(
        ["bash", str(POSTGRES_SCRIPT), action], capture_output=True, text=True, timeout=180
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


@pytest.fixture
def postgres_database(postgres_server, request) -> Callable[[str], str]:
    """Creates fresh databases for one test; returns a function name -> URL."""
    import sqlalchemy

    # No pooled connections: a test may restart the server under them.
    admin = sqlalchemy.create_engine(
        f"{postgres_server}/postgres",
        isolation_level="AUTOCOMMIT",
        poolclass=sqlalchemy.pool.NullPool,
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
        return f"{postgres_server}/{database}"

    yield create
    with admin.connect() as connection:
        for database in created:
            connection.execute(
                sqlalchemy.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            )
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path) -> str:
    """A fresh Optuna storage URL of each kind workers share a study on: a SQLite file, and a
    database of the private PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/optuna.db"
    return request.getfixturevalue("postgres_database")("optuna")

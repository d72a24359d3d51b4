"""New SQLite MLflow stores in the tests start as a copy of one migrated once per process, not by
running MLflow's schema migrations again: 1.4 s of every study in a new directory, of every
`tracking` fixture. The copy holds what the migrations leave, the tables at the head revision
and no rows. Commands that create a store at once take turns for it
(`tuner.tracking.runs.creating`) as they do for the migrations; other databases migrate as usual.

`TUNER_TESTS_MIGRATE=1` in a command's environment makes it migrate as MLflow does, for the
tests of migrating itself. The pytest processes (tests/conftest.py) and the warm commands'
server (tests/warm_server.py) call `stores_from_template` once, as they start.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path


def stores_from_template(directory: Path) -> None:
    """Migrate a template store in `directory`; from now on a new SQLite store in this process
    is a copy of it."""
    import sqlalchemy
    from mlflow.store.db import utils

    migrate = utils._initialize_tables
    template = directory / "mlflow-template.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{template}")
    migrate(engine)
    engine.dispose()

    def initialise(engine: sqlalchemy.engine.Engine) -> None:
        database = engine.url.database
        if (
            engine.dialect.name != "sqlite"
            or database in (None, "", ":memory:")
            or os.environ.get("TUNER_TESTS_MIGRATE") == "1"
        ):
            migrate(engine)
            return
        with closing(sqlite3.connect(template)) as source:
            with closing(sqlite3.connect(database)) as copy:
                source.backup(copy)

    utils._initialize_tables = initialise

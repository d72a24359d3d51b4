"""The plain smoke study (`python -m tuner +experiment=bert_ffn debug=smoke`, every default
backend) that the end-to-end and review tests read. It is made once per test process, by
`conftest.smoke_study`, and each test module that reads it gets a copy of its own, so that what
one module adds to its study (a resumed trial, a run of the front timed again) no other sees."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

SMOKE = ("+experiment=bert_ffn", "debug=smoke")
# Where the copied stores are: the stores `conftest.cli_command` names for a directory.
STORES = ("optuna.db", "mlflow.db")


def copy_of_study(source: Path, destination: Path) -> Path:
    """The study made in `source` (its Optuna and MLflow stores, MLflow's artifacts, Hydra's
    outputs and the saved console), copied into `destination` as if it had been made there:
    every absolute path into `source` the copy holds is rewritten to point into `destination`.
    MLflow keeps its artifact locations absolute, the study keeps its teacher's location, and
    the retrain commands and the console name the stores, so a copy that kept them would read
    and write the original's files."""
    shutil.copytree(source, destination, dirs_exist_ok=True)
    old, new = f"{source}/", f"{destination}/"
    for store in STORES:
        with closing(sqlite3.connect(destination / store)) as db, db:
            tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            for (table,) in tables:
                for column in db.execute(f'PRAGMA table_info("{table}")').fetchall():
                    db.execute(
                        f'UPDATE "{table}" SET "{column[1]}" = replace("{column[1]}", ?, ?) '
                        f'WHERE typeof("{column[1]}") = \'text\' AND instr("{column[1]}", ?) > 0',
                        (old, new, old),
                    )
    # The files that name the source: each logged model's MLmodel, Hydra's saved config, the
    # console's output. Model weights and graphs hold no path, and are left as they are.
    for path in destination.rglob("*"):
        if path.is_file() and path.name not in STORES:
            held = path.read_bytes()
            if old.encode() in held:
                path.write_bytes(held.replace(old.encode(), new.encode()))
    return destination

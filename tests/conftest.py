from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tuner.models.hf_encoder import SequenceClassifier
from tuner.recipe import ModelRecipe

REPO = Path(__file__).resolve().parent.parent


TINY_BERT = ModelRecipe(
    model={
        **OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "minilm.yaml")),
        "random_init": True,
        "config_overrides": {
            "vocab_size": 100,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 1536,
            "max_position_embeddings": 64,
        },
    },
    num_labels=2,
)


@pytest.fixture
def tiny_bert() -> SequenceClassifier:
    """A random-init BERT with MiniLM's FFN width, small enough for unit tests."""
    torch.manual_seed(0)
    return TINY_BERT.build()


def cli_command(cwd: Path, *args: str) -> list[str]:
    """`python -m tuner ARGS` with the Optuna and MLflow stores and Hydra's outputs in `cwd`."""
    return [
        sys.executable,
        "-m",
        "tuner",
        *args,
        f"study.storage=sqlite:///{cwd}/optuna.db",
        f"tracking.uri=sqlite:///{cwd}/mlflow.db",
        f"hydra.run.dir={cwd}/outputs",
    ]


def run_cli(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the CLI as a user would; options such as --config-dir go first in `args`."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    command = cli_command(cwd, *args)
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


POSTGRES_SCRIPT = REPO / "scripts" / "postgres.sh"


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

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel

from tuner.models.hf_encoder import SequenceClassifier

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def tiny_bert() -> SequenceClassifier:
    """A random-init BERT with MiniLM's FFN width, small enough for unit tests."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=1536,
        max_position_embeddings=64,
    )
    model = SequenceClassifier(
        BertModel(config),
        2,
        pooling="mean",
        head_activation="gelu",
        dropout=0.1,
        encoder_is_new=True,
    )
    return model.eval()


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

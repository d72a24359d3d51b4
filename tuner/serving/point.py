"""A point as MLflow serves it: raw examples in (a `text` column, or an array of image pixels),
label and score out, through the point's input pipeline and its artifact's runtime.

This module and what it imports need neither PyTorch nor the rest of tuner: a point whose
backend has a runtime here (ONNX Runtime, OpenVINO) is served in an environment holding only
that runtime, the tokenizer library, numpy, pandas and MLflow. A PyTorch point is served by
`tuner.deploy`'s subclass, which runs the artifact through its backend's loader.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from tuner.serving.inputs import SERVING_INPUTS
from tuner.serving.runtime import RUNTIMES, Runner

# The models-from-code file of points this package serves (`point_loader.py` beside this one).
RUNTIME_LOADER_FILE = Path(__file__).with_name("point_loader.py")


@dataclass(frozen=True)
class PointSpec:
    """What serving needs besides the artifact and the input pipeline. `runtime`: the runtime
    that serves the artifact without PyTorch (`tuner.serving.RUNTIMES`), None for a PyTorch
    artifact (and in points logged before runtimes were recorded)."""

    backend: str
    modality: str
    label_names: list[str]
    deploy: dict[str, Any]
    runtime: str | None = None

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def read(cls, path: Path) -> PointSpec:
        return cls(**json.loads(path.read_text()))


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


class PointModel(mlflow.pyfunc.PythonModel):
    """Classifies raw examples with one point's deployed artifact, on its runtime."""

    def load_context(self, context) -> None:
        self.spec = PointSpec.read(Path(context.artifacts["point"]))
        # Kept for what reads the artifact and the pipeline itself (`tuner.deploy.on_demand`).
        self.artifact = Path(context.artifacts["model"])
        self.inputs_dir = Path(context.artifacts["inputs"])
        self.inputs = SERVING_INPUTS.get(self.spec.modality).load(self.inputs_dir)
        self.logits_of = self.runner()

    def runner(self) -> Runner:
        """The artifact loaded on its runtime."""
        if self.spec.runtime is None:
            raise ValueError(
                f"a {self.spec.backend} point runs on PyTorch: it is served by the loader "
                "of tuner.deploy, not this one"
            )
        return RUNTIMES.get(self.spec.runtime).load(self.artifact, self.spec.deploy)

    # Hinted as a DataFrame for MLflow, which warns at import about any other hint or none; image
    # models receive a numpy array, as their logged signature says, and MLflow passes it as is.
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        items = self.inputs.items_of(model_input)
        if len(items) == 0:
            return pd.DataFrame({"label": pd.Series(dtype=str), "score": pd.Series(dtype=float)})
        logits: np.ndarray | None = None
        for index, arrays in self.inputs.batches(items):
            output = np.asarray(self.logits_of(*arrays), dtype=np.float32)
            if logits is None:
                logits = np.empty((len(items), *output.shape[1:]), dtype=np.float32)
            logits[index] = output
        probabilities = softmax(logits)
        best = probabilities.argmax(axis=-1)
        return pd.DataFrame(
            {
                "label": [self.spec.label_names[i] for i in best.tolist()],
                "score": probabilities.max(axis=-1).astype(np.float64),
            }
        )

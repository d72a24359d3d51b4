"""Deploying a trained model: convert it on a backend, check its accuracy, time it; serve it as
an MLflow model."""

from __future__ import annotations

from tuner.deploy.backends import BACKENDS, unavailable_backends
from tuner.deploy.backends.support.openvino_runtime import bf16_missing as openvino_bf16_missing
from tuner.deploy.backends.support.torch_files import load_weights, read_recipe, save_weights
from tuner.deploy.on_demand import op_table, profile_logged
from tuner.deploy.pipeline import (
    BackendFailed,
    BackendResult,
    Reference,
    check_outputs,
    convert,
    convert_into,
    deploy_on,
    graph_of,
    profile_of,
    reference_of,
)
from tuner.deploy.serving import PointSpec, deploy_config, load_point_model, log_point_model

__all__ = [
    "BACKENDS",
    "BackendFailed",
    "BackendResult",
    "PointSpec",
    "Reference",
    "check_outputs",
    "convert",
    "convert_into",
    "deploy_config",
    "deploy_on",
    "graph_of",
    "load_point_model",
    "load_weights",
    "log_point_model",
    "op_table",
    "openvino_bf16_missing",
    "profile_logged",
    "profile_of",
    "read_recipe",
    "reference_of",
    "save_weights",
    "unavailable_backends",
]

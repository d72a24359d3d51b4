"""Serving a logged point: its input pipeline and the runtimes that run its artifact without
PyTorch (ONNX Runtime, OpenVINO), with numpy arrays in and out. Nothing here imports PyTorch or
a package of tuner above `registry`: a logged model of a runtime's point is served with only
that runtime installed."""

from __future__ import annotations

# Importing the modules registers their input pipelines and runtimes.
from tuner.serving import image, onnxruntime, openvino, text  # noqa: F401
from tuner.serving.image import IMAGE_SETTINGS, ServingImages, with_channels
from tuner.serving.inputs import BATCH_SIZE, SERVING_INPUTS, ServingInputs
from tuner.serving.point import RUNTIME_LOADER_FILE, PointModel, PointSpec
from tuner.serving.runtime import RUNTIMES, Runner, Runtime
from tuner.serving.text import TEXT_COLUMN, TEXT_SETTINGS

__all__ = [
    "BATCH_SIZE",
    "IMAGE_SETTINGS",
    "RUNTIMES",
    "RUNTIME_LOADER_FILE",
    "SERVING_INPUTS",
    "TEXT_COLUMN",
    "TEXT_SETTINGS",
    "PointModel",
    "PointSpec",
    "Runner",
    "Runtime",
    "ServingImages",
    "ServingInputs",
    "with_channels",
]

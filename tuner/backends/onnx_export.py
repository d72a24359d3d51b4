"""ONNX export and ONNX Runtime sessions, shared by the ONNX Runtime backends."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Logits

INPUT_NAMES = ("input_ids", "attention_mask")


def onnxruntime_missing() -> str | None:
    for package in ("onnx", "onnxruntime"):
        if importlib.util.find_spec(package) is None:
            return f"the `{package}` package is not installed"
    return None


def export_onnx(model: nn.Module, ctx: ConversionContext, path: Path) -> Path:
    """TorchScript-based export with batch and sequence length left dynamic."""
    dynamic = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about data-dependent Python values
        torch.onnx.export(
            model.eval(),
            (ctx.example.input_ids, ctx.example.attention_mask),
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=["logits"],
            dynamic_axes={**dynamic, "logits": {0: "batch"}},
            opset_version=int(ctx.deploy.onnx.opset),
            dynamo=False,
        )
    return path


def load_session(path: Path, deploy: DictConfig) -> Logits:
    """A callable running the ONNX file in ONNX Runtime's CPU provider, with the latency
    protocol's thread count."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(deploy.latency.num_threads)
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def logits_of(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feeds = {
            "input_ids": input_ids.numpy().astype(np.int64),
            "attention_mask": attention_mask.numpy().astype(np.int64),
        }
        return torch.from_numpy(session.run(None, feeds)[0])

    return logits_of


def register_onnx_backend(
    name: str, export: Callable[[nn.Module, ConversionContext], Path]
) -> None:
    """An ONNX Runtime backend: its own export, the shared session loader and availability."""
    BACKENDS.register(name)(
        Backend(name=name, export=export, load=load_session, unavailable_reason=onnxruntime_missing)
    )

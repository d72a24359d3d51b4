"""ONNX Runtime in fp32 on the CPU execution provider."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tuner.backends.base import ConversionContext
from tuner.backends.onnx_export import export_onnx, register_onnx_backend


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    return export_onnx(model, ctx, ctx.workdir / "model.onnx")


register_onnx_backend("onnxruntime", _export)

"""ONNX Runtime in fp32 on the CPU execution provider."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext
from tuner.backends.onnx_export import export_onnx, load_session, onnxruntime_missing


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    return export_onnx(model, ctx, ctx.workdir / "model.onnx")


BACKENDS.register("onnxruntime")(
    Backend(
        name="onnxruntime",
        export=_export,
        load=load_session,
        unavailable_reason=onnxruntime_missing,
    )
)

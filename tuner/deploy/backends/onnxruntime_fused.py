"""ONNX Runtime on a graph whose operators are fused before it ships: for text, ONNX Runtime's
transformer optimizer's attention, skip+LayerNorm, bias+GELU and embedding+LayerNorm kernels;
for images, convolutions with their batch norm folded in and their activation fused. The
fused graph is the artifact, so what ships is what was timed; the point records which fused
operators it holds (`tuner.deploy.backends.support.fusion`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from torch import nn

from tuner.deploy.backends.base import ConversionContext
from tuner.deploy.backends.support.fusion import (
    fused_onnx,
    fusion_report,
    modality_of,
    read_notes,
    write_notes,
)
from tuner.deploy.backends.support.onnx_export import register_onnx_backend


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    artifact = Path(shutil.copyfile(fused_onnx(model, ctx), ctx.workdir / "model.fused.onnx"))
    write_notes(artifact, fusion_report(artifact, modality_of(ctx)))
    return artifact


register_onnx_backend("onnxruntime_fused", _export, describe=read_notes)

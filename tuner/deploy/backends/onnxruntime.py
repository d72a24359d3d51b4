"""ONNX Runtime in fp32 on the CPU execution provider."""

from __future__ import annotations

import shutil
from pathlib import Path

from torch import nn

from tuner.deploy.backends.base import ConversionContext
from tuner.deploy.backends.support.onnx_export import exported_onnx, register_onnx_backend


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    # The export other ONNX Runtime backends of this model start from, shipped as it is.
    return Path(shutil.copyfile(exported_onnx(model, ctx), ctx.workdir / "model.onnx"))


register_onnx_backend("onnxruntime", _export)

"""OpenVINO on its CPU plugin: the ONNX export compiled with the latency hint and the protocol's
threads, computing in bf16 where the CPU has native bf16 and in f32 elsewhere
(`deploy.openvino.precision: auto`), or in the precision set there. The plugin fuses the
graph itself (attention, normalisations, activations into the matmuls) and runs its matmuls on
AMX or AVX-512 kernels. The precision used is recorded on the point
(`deploy.inference_precision`)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tuner.deploy.backends.base import ConversionContext
from tuner.deploy.backends.support.openvino_runtime import (
    exported_ir,
    register_openvino_backend,
    save_artifact,
)
from tuner.insight import FP32


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    return save_artifact(exported_ir(model, ctx), ctx.workdir / "openvino", ctx.deploy, {})


# fp32 until the artifact's notes say what `auto` chose on this CPU.
register_openvino_backend("openvino", _export, precision=FP32)

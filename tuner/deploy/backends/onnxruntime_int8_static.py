"""ONNX Runtime with static int8 quantisation: weights per channel and activations quantised
with ranges calibrated (min/max) on batches of training inputs, in QDQ format; 7-bit weights on
CPUs without VNNI (`deploy.onnx.int8`). The node computing the logits stays in fp32: quantised,
its output would be clipped to the range seen in calibration, and an example with larger logits
than any calibration batch would lose them (this halved the largest logit error on a digits
CNN, docs/benchmarks.md). For CNNs this is the int8 route that pays: ONNX Runtime's dynamic
ConvInteger kernels are several times slower than fp32 convolutions on CPU (docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tuner.deploy.backends.base import ConversionContext, calibration_batches
from tuner.deploy.backends.support.onnx_export import (
    exported_onnx,
    int8_options,
    output_nodes,
    quiet_root_logger,
    register_onnx_backend,
)
from tuner.insight import INT8


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    names = ctx.example.names
    feeds = [
        {name: tensor.numpy() for name, tensor in zip(names, inputs, strict=True)}
        for inputs in calibration_batches(ctx)
    ]

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.remaining = iter(feeds)

        def get_next(self):
            return next(self.remaining, None)

    fp32 = exported_onnx(model, ctx)
    artifact = ctx.workdir / "model.int8_static.onnx"
    with quiet_root_logger():
        quantize_static(
            str(fp32),
            str(artifact),
            Batches(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=output_nodes(fp32),
            **int8_options(ctx.deploy),
        )
    return artifact


register_onnx_backend(
    "onnxruntime_int8_static", _export, modalities=frozenset({"image"}), precision=INT8
)

"""ONNX Runtime with static int8 quantisation: weights per channel and activations quantised
with ranges calibrated (min/max) on batches of training inputs, in QDQ format. For CNNs this is
the int8 route that pays: ONNX Runtime's dynamic ConvInteger kernels are several times slower
than fp32 convolutions on CPU (docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from tuner.backends.base import ConversionContext, calibration_batches
from tuner.backends.onnx_export import export_onnx, quiet_root_logger, register_onnx_backend


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

    fp32 = export_onnx(model, ctx, ctx.workdir / "model.fp32.onnx")
    artifact = ctx.workdir / "model.int8_static.onnx"
    with quiet_root_logger():
        quantize_static(
            str(fp32),
            str(artifact),
            Batches(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
    return artifact


register_onnx_backend("onnxruntime_int8_static", _export, modalities=frozenset({"image"}))

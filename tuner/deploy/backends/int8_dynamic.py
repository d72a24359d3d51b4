"""PyTorch dynamic int8 quantisation: Linear weights in int8, activations quantised per call."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.deploy.backends.base import BACKENDS, Backend, ConversionContext, Logits
from tuner.deploy.backends.support.torch_files import load_quantized, save_quantized
from tuner.insight import INT8

ENGINES = ("x86", "fbgemm", "onednn", "qnnpack")


def _unavailable() -> str | None:
    if not set(ENGINES) & set(torch.backends.quantized.supported_engines):
        return "this torch build has no quantized engine (x86, fbgemm, onednn or qnnpack)"
    return None


def _quantize(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao; the API still works here.
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            model.eval(), {nn.Linear}, dtype=torch.qint8, inplace=False
        )


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    return save_quantized(_quantize(model), ctx.recipe, ctx.workdir / "model.int8.safetensors")


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    return load_quantized(artifact, lambda model, saved: _quantize(model))


BACKENDS.register("int8_dynamic")(
    Backend(
        name="int8_dynamic",
        export=_export,
        load=_load,
        unavailable_reason=_unavailable,
        precision=INT8,
    )
)

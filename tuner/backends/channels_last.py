"""Eager fp32 in channels-last (NHWC) memory format, which oneDNN's convolution and pooling
kernels prefer on CPU; the artifact is the eager weights, laid out again when loaded."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Logits
from tuner.backends.torch_files import load_weights, save_weights


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    return save_weights(model.eval(), ctx.recipe, ctx.workdir / "model.safetensors")


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    model = load_weights(artifact).to(memory_format=torch.channels_last)

    def logits_of(images: torch.Tensor) -> torch.Tensor:
        return model(images.contiguous(memory_format=torch.channels_last))

    return logits_of


BACKENDS.register("channels_last")(
    Backend(name="channels_last", export=_export, load=_load, modalities=frozenset({"image"}))
)

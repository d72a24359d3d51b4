"""Eager PyTorch in fp32: the reference every other backend is compared with."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Logits
from tuner.backends.torch_files import load_weights, save_weights


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    return save_weights(model.eval(), ctx.recipe, ctx.workdir / "model.safetensors")


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    return load_weights(artifact)


BACKENDS.register("eager")(Backend(name="eager", export=_export, load=_load))

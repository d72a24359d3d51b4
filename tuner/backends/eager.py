"""Eager PyTorch in fp32: the reference every other backend is compared with."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Logits
from tuner.backends.torch_files import load_module, save_module


def _export(model: nn.Module, ctx: ConversionContext) -> Path:
    return save_module(model.eval(), ctx.workdir / "model.pt")


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    return load_module(artifact)


BACKENDS.register("eager")(Backend(name="eager", export=_export, load=_load))

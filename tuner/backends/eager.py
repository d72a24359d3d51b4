"""Eager PyTorch in fp32: the reference every other backend is compared with."""

from __future__ import annotations

from safetensors.torch import save_model
from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Deployed


def _convert(model: nn.Module, ctx: ConversionContext) -> Deployed:
    model.eval()
    artifact = ctx.workdir / "model.safetensors"
    save_model(model, str(artifact))
    return Deployed(logits_of=model, artifact=artifact)


BACKENDS.register("eager")(Backend(name="eager", convert=_convert))

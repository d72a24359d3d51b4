"""Eager PyTorch in fp32: the reference every other backend is compared with."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_model
from torch import nn

from tuner.backends.base import BACKENDS, Backend, Deployed, ExampleInputs


def _convert(model: nn.Module, example: ExampleInputs, workdir: Path) -> Deployed:
    model.eval()
    artifact = workdir / "model.safetensors"
    save_model(model, str(artifact))
    return Deployed(logits_of=model, artifact=artifact)


BACKENDS.register("eager")(Backend(name="eager", convert=_convert))

"""torch.compile (Inductor) with dynamic shapes; compiling happens inside the conversion."""

from __future__ import annotations

import shutil

import torch
from safetensors.torch import save_model
from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Deployed


def _unavailable() -> str | None:
    if not any(shutil.which(compiler) for compiler in ("c++", "g++", "clang++")):
        return "Inductor needs a C++ compiler (c++, g++ or clang++) on PATH"
    return None


def _convert(model: nn.Module, ctx: ConversionContext) -> Deployed:
    model.eval()
    compiled = torch.compile(model, mode=str(ctx.deploy.compile.mode), dynamic=True)
    # The first call compiles; doing it here counts compile time as conversion, not latency.
    with torch.inference_mode():
        compiled(ctx.example.input_ids, ctx.example.attention_mask)
    artifact = ctx.workdir / "model.safetensors"
    save_model(model, str(artifact))
    return Deployed(logits_of=compiled, artifact=artifact)


BACKENDS.register("compile")(
    Backend(name="compile", convert=_convert, unavailable_reason=_unavailable)
)

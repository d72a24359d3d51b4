"""bf16 via CPU autocast: matmuls in bfloat16, reductions and norms kept in fp32."""

from __future__ import annotations

import torch
from safetensors.torch import save_file
from torch import nn

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Deployed
from tuner.backends.cpu import cpu_flags

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def _unavailable() -> str | None:
    if not cpu_flags() & NATIVE_BF16_FLAGS:
        return "this CPU has no native bf16 instructions (avx512_bf16, amx_bf16 or Arm bf16)"
    return None


def _convert(model: nn.Module, ctx: ConversionContext) -> Deployed:
    model.eval()

    def logits_of(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(input_ids, attention_mask).float()

    # What one would ship: the weights stored in bf16 (autocast computes with them in bf16).
    artifact = ctx.workdir / "model.bf16.safetensors"
    weights = {
        name: (value.to(torch.bfloat16) if value.is_floating_point() else value).contiguous()
        for name, value in model.state_dict().items()
    }
    save_file(weights, str(artifact))
    return Deployed(logits_of=logits_of, artifact=artifact)


BACKENDS.register("bf16")(Backend(name="bf16", convert=_convert, unavailable_reason=_unavailable))

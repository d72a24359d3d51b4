"""bf16 via CPU autocast: weights shipped in bfloat16, matmuls computed in bfloat16, reductions
and norms in fp32."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.deploy.backends.base import BACKENDS, Backend, ConversionContext, Logits
from tuner.deploy.backends.support.torch_files import load_weights, save_weights
from tuner.insight import BF16
from tuner.latency import native_bf16_unavailable


def export_bf16_weights(model: nn.Module, ctx: ConversionContext) -> Path:
    """The model saved in bfloat16: what autocast computes its matmuls with, at half the size."""
    shipped = copy.deepcopy(model).eval().to(torch.bfloat16)
    return save_weights(shipped, ctx.recipe, ctx.workdir / "model.bf16.safetensors")


def cpu_bf16() -> torch.autocast:
    """CPU autocast to bfloat16: matmuls and convolutions in bf16, norms and softmax in fp32."""
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    # Autocast keeps norms and softmax in fp32, so the stored bf16 weights are widened once here
    # (loading casts them into the fp32 architecture) and each matmul casts back to bf16.
    model = load_weights(artifact)

    def logits_of(*inputs: torch.Tensor) -> torch.Tensor:
        with cpu_bf16():
            return model(*inputs).float()

    return logits_of


BACKENDS.register("bf16")(
    Backend(
        name="bf16",
        export=export_bf16_weights,
        load=_load,
        unavailable_reason=native_bf16_unavailable,
        precision=BF16,
    )
)

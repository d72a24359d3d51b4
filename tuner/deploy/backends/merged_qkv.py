"""Eager PyTorch with each self-attention's query, key and value projections merged into one
matmul, attention computed by `scaled_dot_product_attention`: the PyTorch-native fused route
that needs no compiler.

Three matmuls over the same input become one three times as wide, read once; the merged
output is split into query, key and value as views, without copies. The artifact is the eager
weights; merging happens when it is loaded, so what ships is the model one trained and any
PyTorch runs it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn
from torch.nn.functional import scaled_dot_product_attention

from tuner.deploy.backends.base import BACKENDS, Backend, Logits
from tuner.deploy.backends.support.torch_files import export_weights, load_weights, read_recipe

PROJECTIONS = ("query", "key", "value")


class MergedSelfAttention(nn.Module):
    """A Hugging Face encoder's self-attention (its `query`, `key` and `value` Linears and its
    head layout) with the three projections in one Linear; called as the module it replaces."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        projections = [getattr(attention, name) for name in PROJECTIONS]
        first = projections[0]
        self.qkv = nn.Linear(first.in_features, 3 * first.out_features)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([p.weight for p in projections]))
            self.qkv.bias.copy_(torch.cat([p.bias for p in projections]))
        self.num_heads = int(attention.num_attention_heads)
        self.head_size = int(attention.attention_head_size)
        self.scaling = float(attention.scaling)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> tuple[torch.Tensor, None]:
        leading = hidden_states.shape[:-1]
        # (..., 3, heads, head size) -> three (batch, heads, tokens, head size) views.
        query, key, value = (
            self.qkv(hidden_states)
            .view(*leading, 3, self.num_heads, self.head_size)
            .permute(2, 0, 3, 1, 4)
            .unbind(0)
        )
        # The encoder passes a boolean mask (True: attend) or an additive float one, by its
        # attention implementation; scaled_dot_product_attention takes either as it is.
        attended = scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=self.scaling
        )
        return attended.transpose(1, 2).reshape(*leading, -1), None


def _mergeable(module: nn.Module) -> bool:
    projections = [getattr(module, name, None) for name in PROJECTIONS]
    return (
        all(isinstance(p, nn.Linear) and p.bias is not None for p in projections)
        and hasattr(module, "num_attention_heads")
        and not getattr(module, "is_decoder", False)
    )


def merge_qkv(model: nn.Module) -> int:
    """Replace every mergeable self-attention of `model` in place; how many were replaced."""
    targets = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if _mergeable(child)
    ]
    for parent, name in targets:
        setattr(parent, name, MergedSelfAttention(getattr(parent, name)))
    return len(targets)


def _load(artifact: Path, deploy: DictConfig) -> Logits:
    model = load_weights(artifact)
    if not merge_qkv(model):
        raise ValueError(
            "no self-attention with query, key and value projections (Linear with bias) to "
            "merge in this model"
        )
    return model.eval()


def _describe(artifact: Path) -> dict[str, int]:
    # What loading merges depends on the architecture alone: no weights are read for it.
    merged = sum(_mergeable(module) for module in read_recipe(artifact).build().modules())
    return {"merged_attention": merged}


BACKENDS.register("merged_qkv")(
    Backend(
        name="merged_qkv",
        export=export_weights,
        load=_load,
        describe=_describe,
        modalities=frozenset({"text"}),
    )
)

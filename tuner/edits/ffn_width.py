"""Shrink every transformer FFN to a narrower width, keeping its most important neurons.

A BERT-style FFN is `output.dense(act(intermediate.dense(x)))`. Hidden neuron j owns row j of the
first projection and column j of the second; its importance is the product of their L2 norms
(a data-free magnitude criterion). The kept neurons keep their pretrained weights and order, so
the full width reproduces the original model exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tuner.edits.base import EDITS, Edit
from tuner.errors import ConfigError


@dataclass(frozen=True)
class FeedForward:
    """One FFN block: `intermediate.dense` (up-projection) feeding `output.dense` (down)."""

    intermediate: nn.Module
    output: nn.Module

    @property
    def up(self) -> nn.Linear:
        return self.intermediate.dense

    @property
    def down(self) -> nn.Linear:
        return self.output.dense

    @property
    def width(self) -> int:
        return self.up.out_features


def find_feed_forwards(model: nn.Module) -> list[FeedForward]:
    """Every BERT-style block with `intermediate.dense` feeding `output.dense`."""
    blocks = []
    for module in model.modules():
        intermediate = getattr(module, "intermediate", None)
        output = getattr(module, "output", None)
        up = getattr(intermediate, "dense", None)
        down = getattr(output, "dense", None)
        if isinstance(up, nn.Linear) and isinstance(down, nn.Linear):
            if up.out_features == down.in_features:
                blocks.append(FeedForward(intermediate, output))
    return blocks


def neuron_importance(block: FeedForward) -> torch.Tensor:
    with torch.no_grad():
        return block.up.weight.norm(dim=1) * block.down.weight.norm(dim=0)


def _sliced(linear: nn.Linear, keep: torch.Tensor, dim: int) -> nn.Linear:
    out_features, in_features = linear.out_features, linear.in_features
    if dim == 0:
        out_features = len(keep)
    else:
        in_features = len(keep)
    new = nn.Linear(in_features, out_features, bias=linear.bias is not None)
    new.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight.index_select(dim, keep))
        if linear.bias is not None:
            bias = linear.bias if dim == 1 else linear.bias.index_select(0, keep)
            new.bias.copy_(bias)
    return new


def shrink_ffn(model: nn.Module, width: int) -> None:
    """Set every FFN of `model` to `width` hidden neurons, in place."""
    blocks = find_feed_forwards(model)
    if not blocks:
        raise ConfigError(
            "Invalid config: key 'model.ffn_width': the model has no BERT-style FFN blocks "
            "(layer.intermediate.dense -> layer.output.dense)"
        )
    widest = max(block.width for block in blocks)
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= widest:
        raise ConfigError(
            f"Invalid config: key 'model.ffn_width': {width!r} must be an int in [1, {widest}]"
        )
    for block in blocks:
        if width >= block.width:
            continue
        keep = neuron_importance(block).topk(width).indices.sort().values
        block.intermediate.dense = _sliced(block.up, keep, dim=0)
        block.output.dense = _sliced(block.down, keep, dim=1)
    config = getattr(getattr(model, "encoder", model), "config", None)
    if config is not None and hasattr(config, "intermediate_size"):
        config.intermediate_size = width


EDITS.register("ffn_width")(Edit(config_key="ffn_width", apply=shrink_ffn))

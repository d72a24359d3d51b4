"""Shrink every transformer FFN to a narrower width, keeping its most important neurons.

A BERT-style FFN is `output.dense(act(intermediate.dense(x)))`. Hidden neuron j owns row j of the
first projection and column j of the second; its importance is the product of their L2 norms
(a data-free magnitude criterion). The kept neurons keep their pretrained weights and order, so
the full width reproduces the original model exactly. `model.ffn_width_fraction` sets the width
relative to the model's own, so one search space serves encoders of any FFN width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tuner.edits.base import EDITS, Edit, checked_fraction, half_up, sliced_linear
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


def _feed_forwards_for(model: nn.Module, key: str) -> list[FeedForward]:
    blocks = find_feed_forwards(model)
    if not blocks:
        raise ConfigError(
            f"Invalid config: key 'model.{key}': the model has no BERT-style FFN blocks "
            "(layer.intermediate.dense -> layer.output.dense)"
        )
    return blocks


def shrink_ffn(model: nn.Module, width: int) -> None:
    """Set every FFN of `model` to `width` hidden neurons, in place."""
    blocks = _feed_forwards_for(model, "ffn_width")
    widest = max(block.width for block in blocks)
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= widest:
        raise ConfigError(
            f"Invalid config: key 'model.ffn_width': {width!r} must be an int in [1, {widest}]"
        )
    for block in blocks:
        if width >= block.width:
            continue
        keep = neuron_importance(block).topk(width).indices.sort().values
        block.intermediate.dense = sliced_linear(block.up, keep, dim=0)
        block.output.dense = sliced_linear(block.down, keep, dim=1)
    config = getattr(getattr(model, "encoder", model), "config", None)
    if config is not None and hasattr(config, "intermediate_size"):
        config.intermediate_size = width


def ffn_width(model: nn.Module) -> int | None:
    """The model's FFN width (every block has one width); None without BERT-style FFNs."""
    blocks = find_feed_forwards(model)
    return blocks[0].width if blocks else None


EDITS.register("ffn_width")(Edit(config_key="ffn_width", apply=shrink_ffn, reads=ffn_width))

# Widths a fraction resolves to are multiples of this (SIMD- and cache-friendly), for FFNs at
# least twice as wide.
_WIDTH_STEP = 64


def ffn_width_of(model: nn.Module, fraction: float) -> int:
    """The FFN width `fraction` of the model's own stands for: the nearest multiple of 64
    (1536 x 1/3 -> 512, 3072 x 2/3 -> 2048), at least one step; the full width itself when
    that is nearer."""
    key = "ffn_width_fraction"
    blocks = _feed_forwards_for(model, key)
    widest = max(block.width for block in blocks)
    wanted = checked_fraction(key, fraction, "FFN width") * widest
    step = _WIDTH_STEP if widest >= 2 * _WIDTH_STEP else 1
    if widest - wanted < step / 2:
        return widest
    return min(widest, max(step, step * half_up(wanted / step)))


def shrink_ffn_to_fraction(model: nn.Module, fraction: float) -> None:
    shrink_ffn(model, ffn_width_of(model, fraction))


EDITS.register("ffn_width_fraction")(
    Edit(
        config_key="ffn_width_fraction",
        apply=shrink_ffn_to_fraction,
        resolves=("ffn_width", ffn_width_of),
    )
)

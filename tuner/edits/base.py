"""The edit registry and the loop that applies every edit whose config key is set."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.errors import ConfigError
from tuner.registry import Registry


@dataclass(frozen=True)
class Edit:
    """An edit of `model`, applied when `model.<config_key>` is not null.

    Attributes:
        resolves: for an edit relative to the loaded model, the absolute key it stands for and
            how its value is worked out from the unedited model (`ffn_width_fraction` ->
            `ffn_width`), recorded with every point so the architecture is plain to read.
        reads: for an absolute edit, its value on a model as it stands (the FFN width, the
            layer count), or None where the model has nothing it edits.
        measured: the edit chooses what to keep by running the model on training inputs
            (attention heads): `apply` then takes batches of them as a third argument, None
            where there are none (an artifact's architecture rebuilt, an untrained model
            timed), where it keeps what it keeps by position, with the same shapes.
    """

    config_key: str
    apply: Callable[..., None]
    resolves: tuple[str, Callable[[nn.Module, Any], Any]] | None = None
    reads: Callable[[nn.Module], Any] | None = None
    measured: bool = False


EDITS: Registry[Edit] = Registry("model")


def edit_keys() -> set[str]:
    """The `model.*` keys (without the prefix) that an edit reads."""
    return {EDITS.get(name).config_key for name in EDITS}


# Keys that set one edit two ways (absolute, or relative to the loaded model): one at a time.
SAME_EDIT = (
    ("ffn_width", "ffn_width_fraction"),
    ("num_layers", "num_layers_fraction"),
    ("num_heads", "num_heads_fraction"),
)


def apply_edits(
    model: nn.Module,
    model_cfg: DictConfig,
    inputs: Sequence[tuple[torch.Tensor, ...]] | None = None,
) -> list[str]:
    """Apply, in registration order, every edit whose key is set; return the applied keys.
    `inputs`: batches of training inputs, for the edits that measure what to keep."""
    applied = []
    for name in EDITS:
        edit = EDITS.get(name)
        value = model_cfg.get(edit.config_key)
        if value is not None:
            if edit.measured:
                edit.apply(model, value, inputs)
            else:
                edit.apply(model, value)
            applied.append(f"model.{edit.config_key}")
    return applied


def resolved_edits(model: nn.Module, model_cfg: DictConfig) -> dict[str, Any]:
    """`model.<key>` -> value of every relative edit set in `model_cfg`, worked out on the
    unedited `model` (e.g. `model.ffn_width_fraction=0.667` on MiniLM: `model.ffn_width` 1024)."""
    resolved = {}
    for name in EDITS:
        edit = EDITS.get(name)
        value = model_cfg.get(edit.config_key)
        if value is not None and edit.resolves is not None:
            key, resolve = edit.resolves
            resolved[f"model.{key}"] = resolve(model, value)
    return resolved


def architecture_of(model: nn.Module, model_cfg: DictConfig) -> dict[str, Any]:
    """`model.<key>` -> value of every absolute edit on the model `model_cfg` deploys, worked
    out on the unedited `model`: the value typed, the one a fraction resolves to, or the
    model's own where neither is set (an unedited teacher records its own width and depth)."""
    architecture = {}
    for name in EDITS:
        edit = EDITS.get(name)
        own = None if edit.reads is None else edit.reads(model)
        if own is not None:
            typed = model_cfg.get(edit.config_key)
            architecture[f"model.{edit.config_key}"] = own if typed is None else typed
    return {**architecture, **resolved_edits(model, model_cfg)}


def checked_fraction(key: str, value: Any, of_what: str) -> float:
    """`value` of `model.<key>` as a fraction in (0, 1], or a ConfigError naming the key."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(
            f"Invalid config: key 'model.{key}': {value!r} must be a number in (0, 1]: the "
            f"fraction of the model's own {of_what} to keep"
        )
    return float(value)


def sliced_linear(linear: nn.Linear, keep: torch.Tensor, dim: int) -> nn.Linear:
    """A copy of `linear` holding only the outputs (`dim` 0) or inputs (`dim` 1) `keep`, with
    their weights (and the bias, which follows the outputs)."""
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


def half_up(value: float) -> int:
    """Rounded to the nearest int, halves up (Python's round takes halves to even)."""
    return math.floor(value + 0.5)

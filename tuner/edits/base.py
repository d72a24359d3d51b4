"""The edit registry and the loop that applies every edit whose config key is set."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig
from torch import nn

from tuner.registry import Registry


@dataclass(frozen=True)
class Edit:
    """An edit of `model`, applied when `model.<config_key>` is not null."""

    config_key: str
    apply: Callable[[nn.Module, Any], None]


EDITS: Registry[Edit] = Registry("model")


def apply_edits(model: nn.Module, model_cfg: DictConfig) -> list[str]:
    """Apply, in registration order, every edit whose key is set; return the applied keys."""
    applied = []
    for name in EDITS:
        edit = EDITS.get(name)
        value = model_cfg.get(edit.config_key)
        if value is not None:
            edit.apply(model, value)
            applied.append(f"model.{edit.config_key}")
    return applied

"""What every model family provides to training, edits and deployment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.registry import Registry


@dataclass(frozen=True)
class NewLayer:
    """A layer whose weights did not come from a checkpoint, and the activation that follows it
    (`linear` when none does), which is what `train.init=auto` chooses by."""

    name: str
    module: nn.Module
    activation: str


class TunableModel(Protocol):
    """A classifier split at its pooled representation, so mixup can mix there."""

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...

    def classify(self, pooled: torch.Tensor) -> torch.Tensor: ...

    def new_layers(self) -> list[NewLayer]: ...


ModelBuilder = Callable[[DictConfig, int], nn.Module]
MODEL_FAMILIES: Registry[ModelBuilder] = Registry("model.family")


def build_model(model_cfg: DictConfig, num_labels: int) -> nn.Module:
    return MODEL_FAMILIES.get(model_cfg.family)(model_cfg, num_labels)

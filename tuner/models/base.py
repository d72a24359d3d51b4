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
    """A classifier called with the modality's inputs (token ids and attention mask, or
    images) that names its newly created layers. Text families also split at the pooled
    representation (`embed`, `classify`), where text mixup mixes."""

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor: ...

    def new_layers(self) -> list[NewLayer]: ...


@dataclass(frozen=True)
class ModelFamily:
    """How to build a family's models, the input modality they read, and the `model` keys
    that decide what exactly they read (a tokenizer's vocabulary, image channels): two models
    of a family that agree on these take the same inputs."""

    build: Callable[[DictConfig, int], nn.Module]
    modality: str
    input_keys: tuple[str, ...] = ()
    # Whether its models are a stack of transformer layers (depth edits, hidden-state
    # distillation).
    layer_stack: bool = False
    # `model` keys that build a smaller architecture anew (where structural edits cut a built
    # model), and how a model built with them takes a trained larger one's weights (a student
    # that starts from its teacher): (teacher, student) -> None, ValueError naming what does
    # not fit. Without it, a student is a copy of the teacher with its edits applied.
    size_keys: tuple[str, ...] = ()
    inherit: Callable[[nn.Module, nn.Module], None] | None = None


MODEL_FAMILIES: Registry[ModelFamily] = Registry("model.family")


def build_model(model_cfg: DictConfig, num_labels: int) -> nn.Module:
    return MODEL_FAMILIES.get(model_cfg.family).build(model_cfg, num_labels)

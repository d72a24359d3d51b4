"""What a backend is: an availability check and a conversion of the trained model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.registry import Registry

Logits = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ExampleInputs:
    """Inputs with the deployment's batch size and sequence length (for export and timing)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor


@dataclass(frozen=True)
class ConversionContext:
    """What a conversion may use: example inputs, a scratch directory, the `deploy` config."""

    example: ExampleInputs
    workdir: Path
    deploy: DictConfig

    @property
    def num_threads(self) -> int:
        return int(self.deploy.latency.num_threads)


@dataclass(frozen=True)
class Deployed:
    """A converted model: how to call it, and the artifact one would ship."""

    logits_of: Logits
    artifact: Path

    @property
    def size_mb(self) -> float:
        return self.artifact.stat().st_size / 1e6


@dataclass(frozen=True)
class Backend:
    """A deployment target.

    Attributes:
        convert: trained eager fp32 model -> deployed model; must not modify the model.
        unavailable_reason: why this machine cannot run the backend, or None when it can.
    """

    name: str
    convert: Callable[[nn.Module, ConversionContext], Deployed]
    unavailable_reason: Callable[[], str | None] = lambda: None


BACKENDS: Registry[Backend] = Registry("deploy.backend")

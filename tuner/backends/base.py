"""What a backend is: an availability check, an export of the trained model to the artifact one
ships, and a loader that runs that artifact.

Deployment always goes through both halves (export, then load), so the model whose accuracy and
latency are measured is the artifact that is logged and shipped, not an in-memory stand-in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.recipe import ModelRecipe
from tuner.registry import Registry

Logits = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ExampleInputs:
    """Inputs with the deployment's batch size and sequence length (for export and timing)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor


@dataclass(frozen=True)
class ConversionContext:
    """What a conversion may use: example inputs, a scratch directory, the `deploy` config,
    and the model's recipe (PyTorch artifacts ship it beside their weights)."""

    example: ExampleInputs
    workdir: Path
    deploy: DictConfig
    recipe: ModelRecipe


@dataclass(frozen=True)
class Backend:
    """A deployment target.

    Attributes:
        export: trained eager fp32 model -> the artifact file one ships (in `ctx.workdir`);
            must not modify the model.
        load: artifact + the `deploy` config -> a callable returning logits; what serving runs.
        unavailable_reason: why this machine cannot run the backend, or None when it can.
    """

    name: str
    export: Callable[[nn.Module, ConversionContext], Path]
    load: Callable[[Path, DictConfig], Logits]
    unavailable_reason: Callable[[], str | None] = lambda: None


BACKENDS: Registry[Backend] = Registry("deploy.backend")

"""The training loss of one batch, with the mixing each modality uses (`train.mixup_alpha`,
and for images `train.cutmix_alpha`): a registry by modality name."""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.data.batches import Batch
from tuner.registry import Registry

# (model, batch, the trial's generator) -> loss
BatchLoss = Callable[[nn.Module, Batch, torch.Generator], torch.Tensor]

# (the `train` config, number of labels) -> the batch loss of a trial
MIXING: Registry[Callable[[DictConfig, int], BatchLoss]] = Registry("data.source")


def plain_loss(model: nn.Module, batch: Batch, generator: torch.Generator) -> torch.Tensor:
    return nn.functional.cross_entropy(model(*batch.inputs), batch.labels)


def batch_loss(modality: str, train_cfg: DictConfig, num_labels: int) -> BatchLoss:
    return MIXING.get(modality)(train_cfg, num_labels)

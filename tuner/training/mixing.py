"""The training loss of one batch, with the mixing each modality uses (`train.mixup_alpha`,
and for images `train.cutmix_alpha`): a registry by modality name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.data import Batch
from tuner.registry import Registry


@dataclass(frozen=True)
class BatchOutput:
    """One training batch through the model: its loss against the batch's (possibly mixed)
    labels, the logits that loss came from, and for a mixed batch how another model (a
    distillation teacher) sees the same mixed input."""

    loss: torch.Tensor
    logits: torch.Tensor
    # The logits of another model on this batch's mixed input; None for an unmixed batch,
    # which another model sees as the batch's own inputs.
    mixed_logits_of: Callable[[nn.Module], torch.Tensor] | None = None


# (model, batch, the trial's generator) -> the batch's output
BatchLoss = Callable[[nn.Module, Batch, torch.Generator], BatchOutput]

# (the `train` config, number of labels) -> the batch loss of a trial
MIXING: Registry[Callable[[DictConfig, int], BatchLoss]] = Registry("data.source")


def plain_loss(model: nn.Module, batch: Batch, generator: torch.Generator) -> BatchOutput:
    logits = model(*batch.inputs)
    return BatchOutput(nn.functional.cross_entropy(logits, batch.labels), logits)


def batch_loss(modality: str, train_cfg: DictConfig, num_labels: int) -> BatchLoss:
    return MIXING.get(modality)(train_cfg, num_labels)

"""Mixup for text, applied to pooled sentence representations.

Token ids cannot be interpolated, so (as in Sun et al., "Mixup-Transformer", 2020) the encoder's
pooled representations of two examples are mixed, and the loss mixes their labels the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from tuner.data import Batch
from tuner.training.mixing import MIXING, BatchLoss, BatchOutput, plain_loss


@dataclass(frozen=True)
class Mixed:
    pooled: torch.Tensor
    labels_a: torch.Tensor
    labels_b: torch.Tensor
    lam: float
    partner: torch.Tensor

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        ce = torch.nn.functional.cross_entropy
        return self.lam * ce(logits, self.labels_a) + (1 - self.lam) * ce(logits, self.labels_b)


def mixup(
    pooled: torch.Tensor, labels: torch.Tensor, alpha: float, generator: torch.Generator
) -> Mixed:
    """Mix each example with a random partner by lam ~ Beta(alpha, alpha)."""
    # torch's Beta takes no generator; a numpy draw seeded from it keeps trials reproducible.
    seed = int(torch.randint(0, 2**31 - 1, (), generator=generator))
    lam = float(np.random.default_rng(seed).beta(alpha, alpha))
    partner = torch.randperm(pooled.shape[0], generator=generator)
    mixed = lam * pooled + (1 - lam) * pooled[partner]
    return Mixed(mixed, labels, labels[partner], lam, partner)


@MIXING.register("text")
def text_loss(train_cfg: DictConfig, num_labels: int) -> BatchLoss:
    alpha = float(train_cfg.mixup_alpha)
    if alpha <= 0:
        return plain_loss

    def loss(model: nn.Module, batch: Batch, generator: torch.Generator) -> BatchOutput:
        mixed = mixup(model.embed(*batch.inputs), batch.labels, alpha, generator)
        logits = model.classify(mixed.pooled)

        def mixed_logits_of(other: nn.Module) -> torch.Tensor:
            # The other model's own pooled representations, mixed by the same lam and partners.
            pooled = other.embed(*batch.inputs)
            return other.classify(mixed.lam * pooled + (1 - mixed.lam) * pooled[mixed.partner])

        return BatchOutput(mixed.loss(logits), logits, mixed_logits_of)

    return loss

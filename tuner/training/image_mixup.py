"""Mixup and cutmix for images, by timm's own `Mixup` (batch mode: every image is mixed with
the image at the mirrored position of the batch, by one lam per batch) and its soft-target
cross entropy."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from tuner.data import Batch
from tuner.training.mixing import MIXING, BatchLoss, BatchOutput, plain_loss


@contextmanager
def _numpy_seeded(seed: int) -> Iterator[None]:
    """timm draws lam and the cutmix box from numpy's global generator; seeding it from the
    trial's generator keeps trials reproducible, and restoring it leaves others undisturbed."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def image_mixer(train_cfg: DictConfig, num_labels: int):
    """timm's `Mixup`, imported here: timm takes seconds to import, which text runs never need."""
    from timm.data import Mixup

    return Mixup(
        mixup_alpha=float(train_cfg.mixup_alpha),
        cutmix_alpha=float(train_cfg.get("cutmix_alpha", 0.0)),
        prob=1.0,
        # With both on, each batch uses one of them, chosen at random.
        switch_prob=0.5,
        mode="batch",
        label_smoothing=0.0,
        num_classes=num_labels,
    )


def mix_images(
    mixer, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixed images and their soft targets; the input tensor is left as it was."""
    seed = int(torch.randint(0, 2**31 - 1, (), generator=generator))
    with _numpy_seeded(seed):
        return mixer(images.clone(), labels)


@MIXING.register("image")
def image_loss(train_cfg: DictConfig, num_labels: int) -> BatchLoss:
    if float(train_cfg.mixup_alpha) <= 0 and float(train_cfg.get("cutmix_alpha", 0.0)) <= 0:
        return plain_loss
    from timm.loss import SoftTargetCrossEntropy

    mixer = image_mixer(train_cfg, num_labels)
    soft_cross_entropy = SoftTargetCrossEntropy()

    def loss(model: nn.Module, batch: Batch, generator: torch.Generator) -> BatchOutput:
        (images,), labels = batch.inputs, batch.labels
        # timm mixes a batch with its mirror image and needs an even size; an odd last batch
        # leaves one image out, as timm's own training loaders drop incomplete batches.
        even = len(labels) - len(labels) % 2
        if even == 0:
            return plain_loss(model, batch, generator)
        mixed, targets = mix_images(mixer, images[:even], labels[:even], generator)
        logits = model(mixed)
        return BatchOutput(soft_cross_entropy(logits, targets), logits, lambda other: other(mixed))

    return loss

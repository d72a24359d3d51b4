"""Training knobs (optimiser and L2, clipping, initialisation, mixup), where and in what
precision models train, and the training loop."""

from __future__ import annotations

from tuner.training.init_schemes import INIT_SCHEMES, initialise_new_layers
from tuner.training.loop import (
    EpochResult,
    TrainResult,
    accuracy,
    collect_logits,
    evaluate,
    train,
    validation_logits,
)
from tuner.training.mixing import MIXING, BatchLoss, batch_loss
from tuner.training.mixup import mixup

# Importing the module registers the image mixing.
from tuner.training import image_mixup  # noqa: E402,F401  isort: skip
from tuner.training.optim import OPTIMIZERS, build_optimizer
from tuner.training.placement import TRAIN_PRECISIONS, Placement

__all__ = [
    "MIXING",
    "BatchLoss",
    "batch_loss",
    "INIT_SCHEMES",
    "OPTIMIZERS",
    "TRAIN_PRECISIONS",
    "Placement",
    "EpochResult",
    "TrainResult",
    "accuracy",
    "collect_logits",
    "build_optimizer",
    "evaluate",
    "initialise_new_layers",
    "mixup",
    "train",
    "validation_logits",
]

"""Training knobs (optimiser and L2, clipping, initialisation, mixup), where and in what
precision models train, and the training loop."""

from __future__ import annotations

from tuner.training.evaluation import accuracy, collect_logits, evaluate
from tuner.training.init_schemes import INIT_SCHEMES, initialise_new_layers
from tuner.training.loop import EpochResult, TrainResult, train, validation_logits
from tuner.training.mixing import MIXING, BatchLoss, batch_loss
from tuner.training.mixup import mixup

# Importing the module registers the image mixing.
from tuner.training import image_mixup  # noqa: E402,F401  isort: skip
from tuner.training.distill import Distillation
from tuner.training.optim import OPTIMIZERS, build_optimizer
from tuner.training.placement import TRAIN_PRECISIONS, Placement

__all__ = [
    "BatchLoss",
    "Distillation",
    "EpochResult",
    "INIT_SCHEMES",
    "MIXING",
    "OPTIMIZERS",
    "Placement",
    "TRAIN_PRECISIONS",
    "TrainResult",
    "accuracy",
    "batch_loss",
    "build_optimizer",
    "collect_logits",
    "evaluate",
    "initialise_new_layers",
    "mixup",
    "train",
    "validation_logits",
]

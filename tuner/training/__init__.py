"""Training knobs (optimiser and L2, clipping, initialisation, mixup) and the training loop."""

from __future__ import annotations

from tuner.training.init_schemes import INIT_SCHEMES, initialise_new_layers
from tuner.training.loop import (
    EpochResult,
    TrainResult,
    accuracy,
    collect_logits,
    evaluate,
    train,
)
from tuner.training.mixup import mixup
from tuner.training.optim import OPTIMIZERS, build_optimizer

__all__ = [
    "INIT_SCHEMES",
    "OPTIMIZERS",
    "EpochResult",
    "TrainResult",
    "accuracy",
    "collect_logits",
    "build_optimizer",
    "evaluate",
    "initialise_new_layers",
    "mixup",
    "train",
]

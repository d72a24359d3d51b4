"""Optimisers by name, with the L2 penalty on weight matrices only (not biases or norms)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from tuner.registry import Registry

ParamGroups = list[dict]
OPTIMIZERS: Registry[Callable[[ParamGroups, float], torch.optim.Optimizer]] = Registry(
    "train.optimizer"
)

# Adam's weight_decay adds weight_decay * w to the gradient: a classic L2 penalty.
OPTIMIZERS.register("adam")(lambda groups, lr: torch.optim.Adam(groups, lr=lr))
# AdamW decays weights directly, decoupled from the adaptive step (Loshchilov & Hutter).
OPTIMIZERS.register("adamw")(lambda groups, lr: torch.optim.AdamW(groups, lr=lr))
OPTIMIZERS.register("sgd")(lambda groups, lr: torch.optim.SGD(groups, lr=lr, momentum=0.9))


def _param_groups(
    parameters: Iterable[tuple[str, nn.Parameter]], weight_decay: float
) -> ParamGroups:
    decay, no_decay = [], []
    for _, param in parameters:
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float):
    return OPTIMIZERS.get(name)(_param_groups(model.named_parameters(), weight_decay), lr)

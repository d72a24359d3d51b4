"""Initialisation of newly created layers: Xavier, Kaiming, or `auto` by the activation.

Kaiming (He) initialisation preserves activation variance through rectifier-like activations;
Xavier (Glorot) suits tanh, sigmoid and linear outputs. `auto` picks by the activation that
follows each layer, as the model reports it. Biases start at zero.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tuner.models import NewLayer
from tuner.registry import Registry

RECTIFIERS = frozenset({"relu", "gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "swish"})


def _gain_name(activation: str) -> str:
    # torch names no gain for GELU or SiLU; ReLU's is the usual stand-in for them.
    if activation in RECTIFIERS:
        return "relu"
    return activation if activation in ("tanh", "sigmoid") else "linear"


def _xavier(weight: torch.Tensor, activation: str) -> None:
    nn.init.xavier_uniform_(weight, gain=nn.init.calculate_gain(_gain_name(activation)))


def _kaiming(weight: torch.Tensor, activation: str) -> None:
    nn.init.kaiming_normal_(weight, mode="fan_in", nonlinearity=_gain_name(activation))


def _auto(weight: torch.Tensor, activation: str) -> None:
    (_kaiming if activation in RECTIFIERS else _xavier)(weight, activation)


INIT_SCHEMES: Registry[Callable[[torch.Tensor, str], None]] = Registry("train.init")
INIT_SCHEMES.register("xavier")(_xavier)
INIT_SCHEMES.register("kaiming")(_kaiming)
INIT_SCHEMES.register("auto")(_auto)


def initialise_new_layers(layers: list[NewLayer], scheme: str) -> None:
    init = INIT_SCHEMES.get(scheme)
    with torch.no_grad():
        for layer in layers:
            weight = getattr(layer.module, "weight", None)
            if weight is None or weight.dim() < 2:
                continue
            init(weight, layer.activation)
            bias = getattr(layer.module, "bias", None)
            if bias is not None:
                bias.zero_()

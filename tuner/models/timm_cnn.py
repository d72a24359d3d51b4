"""Any timm image classifier, trained from scratch on the data's own resolution and channels.

`model.name` is a timm model name; `model.in_chans` adapts its stem to the images' channels.
The structural knobs `model.width_multiplier` and `model.depth` are turned into the
architecture's own constructor arguments by a registry keyed by timm's model module, beside
how a model so narrowed or shortened takes a trained one's weights; a new architecture family
is one more entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from tuner.errors import ConfigError
from tuner.models.base import MODEL_FAMILIES, ModelFamily, NewLayer
from tuner.models.resnet_slicing import inherit_resnet
from tuner.registry import Registry

# Activation class name -> the name `train.init=auto` chooses by. By name, because timm has its
# own classes beside torch's (timm.layers.activations.Tanh, GELU, Swish, ...).
_ACTIVATION_NAMES: dict[str, str] = {
    "ReLU": "relu",
    "ReLU6": "relu",
    "LeakyReLU": "relu",
    "GELU": "gelu",
    "GELUTanh": "gelu",
    "SiLU": "silu",
    "Swish": "silu",
    "Hardswish": "silu",
    "HardSwish": "silu",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
}

# The keys below: they build the architecture anew at its size, unlike structural edits.
SIZE_KEYS = ("width_multiplier", "depth")


@dataclass(frozen=True)
class Structure:
    """How an architecture family of timm is sized, and how a smaller one starts from a larger
    trained one.

    Attributes:
        args: (width multiplier or None, blocks per stage or None) -> constructor keyword
            arguments.
        inherit: (trained net, smaller net) -> None: fills the smaller net with the trained
            one's weights; ValueError where it is not smaller in a way that allows it.
    """

    args: Callable[[float | None, int | None], dict[str, Any]]
    inherit: Callable[[nn.Module, nn.Module], None]


STRUCTURES: Registry[Structure] = Registry("model.name")

_RESNET_CHANNELS = (64, 128, 256, 512)


def _resnet_args(width: float | None, depth: int | None) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if width is not None:
        # The stages' widths; the plain 7x7 stem keeps its 64 channels (timm's stem_width only
        # applies to deep stems).
        args["channels"] = tuple(max(1, round(c * width)) for c in _RESNET_CHANNELS)
    if depth is not None:
        args["layers"] = (depth,) * len(_RESNET_CHANNELS)
    return args


STRUCTURES.register("timm.models.resnet")(Structure(args=_resnet_args, inherit=inherit_resnet))


class TimmClassifier(nn.Module):
    """A timm model called with a batch of images; names its layers for initialisation."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def activation(self) -> str:
        """The model's activation: the first activation module, in definition order."""
        for module in self.net.modules():
            name = _ACTIVATION_NAMES.get(type(module).__name__)
            if name is not None:
                return name
        return "linear"

    def new_layers(self) -> list[NewLayer]:
        """Every convolution and linear layer (the model is trained from scratch): the
        classifier produces logits; everything else feeds the model's activation."""
        activation = self.activation()
        classifier = self.net.get_classifier()
        return [
            NewLayer(name, module, "linear" if module is classifier else activation)
            for name, module in self.net.named_modules()
            if isinstance(module, (nn.Conv2d, nn.Linear))
        ]


def _structure_args(model_cfg: DictConfig) -> dict[str, Any]:
    import timm

    width, depth = model_cfg.get("width_multiplier"), model_cfg.get("depth")
    if width is None and depth is None:
        return {}
    module = timm.models.model_entrypoint(str(model_cfg.name)).__module__
    if module not in STRUCTURES:
        raise ConfigError(
            f"Invalid config: key 'model.width_multiplier'/'model.depth': '{model_cfg.name}' "
            f"comes from {module}; these edits support {', '.join(STRUCTURES.names())} "
            "(set both to null for other models)"
        )
    return STRUCTURES.get(module).args(
        None if width is None else float(width), None if depth is None else int(depth)
    )


def build_timm(model_cfg: DictConfig, num_labels: int) -> nn.Module:
    import timm

    name = str(model_cfg.name)
    if not timm.is_model(name):
        raise ConfigError(
            f"Invalid config: key 'model.name': '{name}' is not a timm model "
            "(see timm.list_models(), e.g. resnet18)"
        )
    try:
        net = timm.create_model(
            name,
            pretrained=False,
            num_classes=num_labels,
            in_chans=int(model_cfg.in_chans),
            drop_rate=float(model_cfg.get("drop_rate", 0.0)),
            **_structure_args(model_cfg),
            **dict(model_cfg.get("kwargs") or {}),
        )
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(
            f"Invalid config: key 'model.name': cannot build timm model '{name}': {exc}"
        ) from None
    return TimmClassifier(net)


def inherit_timm(teacher: nn.Module, student: nn.Module) -> None:
    """Fill `student` with the trained `teacher`'s weights (both `TimmClassifier`s); ValueError
    naming what does not fit."""
    module = type(teacher.net).__module__
    if module in STRUCTURES:
        STRUCTURES.get(module).inherit(teacher.net, student.net)
        return
    # Architectures without a registered structure are never resized: the student is a model
    # of the teacher's own shape.
    try:
        student.net.load_state_dict(teacher.net.state_dict())
    except RuntimeError as exc:
        raise ValueError(" ".join(str(exc).split())) from None


MODEL_FAMILIES.register("timm")(
    ModelFamily(
        build=build_timm,
        modality="image",
        input_keys=("in_chans",),
        size_keys=SIZE_KEYS,
        inherit=inherit_timm,
    )
)

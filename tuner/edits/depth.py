"""Drop the top transformer layers, keeping the bottom `model.num_layers` with their weights.

Dropping the top layers of a pretrained encoder and fine-tuning the rest keeps most of its
accuracy on sentence classification (Sajjad et al., "On the effect of dropping layers of
pre-trained transformer models", 2023), and latency falls with the layer count.
"""

from __future__ import annotations

from torch import nn

from tuner.edits.base import EDITS, Edit
from tuner.errors import ConfigError


def find_layer_stack(model: nn.Module) -> tuple[nn.Module, str, nn.ModuleList]:
    """The module list of transformer blocks: `layer` or `layers`, as HF encoders name it."""
    for module in model.modules():
        for name in ("layer", "layers"):
            stack = getattr(module, name, None)
            if isinstance(stack, nn.ModuleList) and len(stack) > 0:
                return module, name, stack
    raise ConfigError(
        "Invalid config: key 'model.num_layers': the model has no stack of transformer layers "
        "(a ModuleList named `layer` or `layers`)"
    )


def keep_bottom_layers(model: nn.Module, num_layers: int) -> None:
    """Keep the first `num_layers` blocks of the encoder, in place."""
    parent, name, stack = find_layer_stack(model)
    if (
        not isinstance(num_layers, int)
        or isinstance(num_layers, bool)
        or not (1 <= num_layers <= len(stack))
    ):
        raise ConfigError(
            f"Invalid config: key 'model.num_layers': {num_layers!r} must be an int in "
            f"[1, {len(stack)}]"
        )
    setattr(parent, name, nn.ModuleList(list(stack)[:num_layers]))
    config = getattr(getattr(model, "encoder", model), "config", None)
    if config is not None and hasattr(config, "num_hidden_layers"):
        config.num_hidden_layers = num_layers


EDITS.register("num_layers")(Edit(config_key="num_layers", apply=keep_bottom_layers))

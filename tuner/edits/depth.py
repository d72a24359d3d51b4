"""Drop the top transformer layers, keeping the bottom `model.num_layers` with their weights.

Dropping the top layers of a pretrained encoder and fine-tuning the rest keeps most of its
accuracy on sentence classification (Sajjad et al., "On the effect of dropping layers of
pre-trained transformer models", 2023), and latency falls with the layer count.
`model.num_layers_fraction` keeps a fraction of the model's own layers, so one search space
serves encoders of any depth.
"""

from __future__ import annotations

from torch import nn

from tuner.edits.base import EDITS, Edit, checked_fraction, half_up
from tuner.errors import ConfigError


def find_layer_stack(
    model: nn.Module, key: str = "num_layers"
) -> tuple[nn.Module, str, nn.ModuleList]:
    """The module list of transformer blocks: `layer` or `layers`, as HF encoders name it;
    errors name `model.<key>`, the edit that needs it."""
    for module in model.modules():
        for name in ("layer", "layers"):
            stack = getattr(module, name, None)
            if isinstance(stack, nn.ModuleList) and len(stack) > 0:
                return module, name, stack
    raise ConfigError(
        f"Invalid config: key 'model.{key}': the model has no stack of transformer layers "
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


def layer_count(model: nn.Module) -> int | None:
    """How many transformer layers the model has; None without a stack of them."""
    try:
        return len(find_layer_stack(model)[2])
    except ConfigError:
        return None


EDITS.register("num_layers")(
    Edit(config_key="num_layers", apply=keep_bottom_layers, reads=layer_count)
)


def num_layers_of(model: nn.Module, fraction: float) -> int:
    """The layer count `fraction` of the model's own stands for, rounded half up, at least 1
    (6 x 2/3 -> 4, 12 x 0.5 -> 6, 2 x 0.667 -> 1)."""
    key = "num_layers_fraction"
    _, _, stack = find_layer_stack(model, key)
    return max(1, half_up(checked_fraction(key, fraction, "layers") * len(stack)))


def keep_bottom_fraction(model: nn.Module, fraction: float) -> None:
    keep_bottom_layers(model, num_layers_of(model, fraction))


EDITS.register("num_layers_fraction")(
    Edit(
        config_key="num_layers_fraction",
        apply=keep_bottom_fraction,
        resolves=("num_layers", num_layers_of),
    )
)

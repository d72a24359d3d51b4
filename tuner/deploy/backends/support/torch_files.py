"""PyTorch weights as files, shared by the backends that ship a PyTorch model.

Weights are plain tensors in safetensors files with the model's recipe in their metadata: the
float weights, or a quantised model's state dict laid out as plain tensors
(`tuner.deploy.backends.support.quantized_state`). Loading rebuilds the architecture from the
recipe and fills it, so no artifact can run code when it is loaded. Quantised artifacts made by
earlier versions are torch.save files, read back with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model
from torch import nn

from tuner.deploy.backends.support.quantized_state import load_state, save_state
from tuner.models import ModelRecipe

if TYPE_CHECKING:
    from tuner.deploy.backends.base import ConversionContext

RECIPE_KEY = "tuner.recipe"
# Metadata key of a quantised artifact's extras, as JSON.
EXTRAS_KEY = "tuner.extras"


def save_weights(module: nn.Module, recipe: ModelRecipe, path: Path) -> Path:
    save_model(module, str(path), metadata={RECIPE_KEY: recipe.to_json()})
    return path


def export_weights(model: nn.Module, ctx: ConversionContext) -> Path:
    """The eager fp32 weights as the artifact: for backends that change only how the model
    runs (compile, memory format, folding), which they apply when loading."""
    return save_weights(model.eval(), ctx.recipe, ctx.workdir / "model.safetensors")


def read_recipe(path: Path) -> ModelRecipe:
    """The recipe saved beside safetensors weights."""
    with safe_open(str(path), framework="pt") as stored:
        return ModelRecipe.from_json(stored.metadata()[RECIPE_KEY])


def load_weights(path: Path) -> nn.Module:
    """The float model; weights stored in another float dtype are cast to the model's."""
    model = read_recipe(path).build()
    load_model(model, str(path))
    return model.eval()


def save_quantized(module: nn.Module, recipe: ModelRecipe, path: Path, **extras: Any) -> Path:
    """The quantised state, the recipe, and `extras` (plain values the quantiser needs again)."""
    metadata = {RECIPE_KEY: recipe.to_json(), EXTRAS_KEY: json.dumps(extras)}
    return save_state(module.state_dict(), path, metadata)


def read_quantized(path: Path) -> dict[str, Any]:
    """The recipe, the state dict (`state_dict`) and the extras saved by `save_quantized`."""
    if zipfile.is_zipfile(path):
        return _read_torch_save(path)
    state, metadata = load_state(path)
    return {
        RECIPE_KEY: metadata[RECIPE_KEY],
        "state_dict": state,
        **json.loads(metadata[EXTRAS_KEY]),
    }


def _read_torch_save(path: Path) -> dict[str, Any]:
    """A quantised artifact as earlier versions saved it (torch.save), read with the unpickler
    that builds tensors and plain containers only."""
    with warnings.catch_warnings():
        # Quantised tensors are rebuilt through torch's deprecated TypedStorage path.
        warnings.simplefilter("ignore", UserWarning)
        return torch.load(path, weights_only=True, map_location="cpu")


def load_quantized(
    path: Path, quantize: Callable[[nn.Module, dict[str, Any]], nn.Module]
) -> nn.Module:
    """Rebuild the float architecture, quantise it the same way (given everything saved), then
    load the saved state: scales and zero points included, so no calibration runs again."""
    saved = read_quantized(path)
    model = quantize(ModelRecipe.from_json(saved[RECIPE_KEY]).build(), saved)
    model.load_state_dict(saved["state_dict"])
    return model.eval()

"""Models by family: each family builds a classifier and names its newly created layers."""

from __future__ import annotations

from tuner.models.base import MODEL_FAMILIES, ModelFamily, NewLayer, TunableModel, build_model
from tuner.models.packaged import PACKAGED_MODELS, resolve_name_or_path

# Importing the module registers its family.
from tuner.models import hf_encoder, timm_cnn  # noqa: E402,F401  isort: skip

from tuner.models.recipe import ModelRecipe

__all__ = [
    "MODEL_FAMILIES",
    "ModelFamily",
    "ModelRecipe",
    "NewLayer",
    "PACKAGED_MODELS",
    "TunableModel",
    "build_model",
    "resolve_name_or_path",
]

"""Operator backends a trained model is deployed on: a registry, one module per backend."""

from __future__ import annotations

from tuner.backends.base import BACKENDS, Backend, Deployed, ExampleInputs

# Importing the module registers its backend.
from tuner.backends import eager  # noqa: E402,F401  isort: skip

__all__ = ["BACKENDS", "Backend", "Deployed", "ExampleInputs"]

"""Operator backends a trained model is deployed on: a registry, one module per backend."""

from __future__ import annotations

from tuner.backends.base import BACKENDS, Backend, ConversionContext, Deployed, ExampleInputs

# Importing the modules registers their backends.
from tuner.backends import (  # noqa: E402,F401  isort: skip
    bf16,
    compiled,
    eager,
    int8_dynamic,
    ort_fp32,
    ort_int8,
)

__all__ = ["BACKENDS", "Backend", "ConversionContext", "Deployed", "ExampleInputs"]

"""Operator backends a trained model is deployed on: a registry, one module per backend.

Every module of this package is imported here, so a new backend is one new file that registers
itself with `BACKENDS.register(name)(Backend(...))`.
"""

from __future__ import annotations

import importlib
import pkgutil

from tuner.data import ExampleInputs
from tuner.deploy.backends.base import (
    BACKENDS,
    Backend,
    ConversionContext,
    Logits,
    unavailable_backends,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "BACKENDS",
    "Backend",
    "ConversionContext",
    "ExampleInputs",
    "Logits",
    "unavailable_backends",
]

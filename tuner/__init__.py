"""tuner: search training knobs, structural edits and operator backends for PyTorch models."""

from __future__ import annotations

# First of all: its exit handler must be registered before any library's (see the module).
import tuner.quick_exit  # noqa: F401

__version__ = "0.1.0"
__all__ = ["__version__"]

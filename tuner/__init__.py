"""tuner: search training knobs, structural edits and operator backends for PyTorch models."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]

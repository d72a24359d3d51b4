"""Classification data: sources by name, and a seeded train/validation/test split."""

from __future__ import annotations

from tuner.data.sources import DATA_SOURCES, RawData
from tuner.data.splits import Examples, Splits, load_splits

# Importing the modules registers their sources.
from tuner.data import digits, fashion_mnist, files, hf, rotten_tomatoes  # noqa: E402,F401  isort: skip

__all__ = ["DATA_SOURCES", "Examples", "RawData", "Splits", "load_splits"]

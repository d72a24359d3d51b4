"""Text classification data: sources by name, and a seeded train/validation/test split."""

from __future__ import annotations

from tuner.data.sources import DATA_SOURCES, RawTexts
from tuner.data.splits import TextExamples, TextSplits, load_splits

# Importing the modules registers their sources.
from tuner.data import files, hf, rotten_tomatoes  # noqa: E402,F401  isort: skip

__all__ = ["DATA_SOURCES", "RawTexts", "TextExamples", "TextSplits", "load_splits"]

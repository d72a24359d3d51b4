"""Input modalities (text, image): a registry of input pipelines chosen by the data source."""

from __future__ import annotations

from tuner.modalities.base import MODALITIES, Modality

# Importing the modules registers their modalities.
from tuner.modalities import image, text  # noqa: E402,F401  isort: skip

__all__ = ["MODALITIES", "Modality"]

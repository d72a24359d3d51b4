"""The registry of data sources; each returns the raw examples and labels of its corpus."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from tuner.registry import Registry


@dataclass(frozen=True)
class RawData:
    """A corpus before splitting.

    Attributes:
        items: the examples: texts, or images as one array (N, H, W) or (N, C, H, W).
        labels: one label of any hashable type per example.
        origin: where the corpus came from, named in errors.
        modality: which input pipeline reads the items (`tuner.modalities`).
        test: the source's own held-out test set (e.g. Fashion-MNIST's t10k), used as the test
            split instead of one carved from `items`.
        dropped: what was left out of the source, told to the user (`data.drop_empty`).
    """

    items: Sequence[Any]
    labels: Sequence[Any]
    origin: str
    modality: str = "text"
    test: RawData | None = None
    dropped: str | None = None


DATA_SOURCES: Registry[Callable[[DictConfig], RawData]] = Registry("data.source")

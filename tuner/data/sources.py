"""The registry of data sources; each returns raw texts and labels for the whole corpus."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from tuner.registry import Registry


@dataclass(frozen=True)
class RawTexts:
    """A corpus before splitting: texts with labels of any hashable type, and where it came from."""

    texts: Sequence[str]
    labels: Sequence[Any]
    origin: str


DATA_SOURCES: Registry[Callable[[DictConfig], RawTexts]] = Registry("data.source")

"""What differs between input modalities, behind one interface: how raw examples become model
inputs (for training, timing and serving alike), and what a logged model takes as input."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from mlflow.models import ModelSignature
from omegaconf import DictConfig

from tuner.config import SearchSpace
from tuner.data import Encoded, ExampleInputs, Splits
from tuner.latency import LatencyProtocol
from tuner.registry import Registry


class Modality(ABC):
    """One input pipeline, fitted to a study's data and saved beside every logged model."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: DictConfig, splits: Splits) -> Modality:
        """The pipeline for this study; raises ConfigError naming the key when it cannot be."""

    @staticmethod
    @abstractmethod
    def check(cfg: DictConfig, space: SearchSpace) -> None:
        """Refuse, before any training, config values this modality cannot honour."""

    @abstractmethod
    def encode(self, items: Sequence[Any], labels: Sequence[int] | None = None) -> Encoded:
        """Raw examples as model inputs; unlabelled ones (serving) get label 0."""

    @abstractmethod
    def example(self, items: Sequence[Any], protocol: LatencyProtocol) -> ExampleInputs:
        """Real inputs in the latency protocol's shape, for export and timing."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Everything `load` needs to rebuild this pipeline (shipped with logged models)."""

    @classmethod
    @abstractmethod
    def load(cls, directory: Path) -> Modality: ...

    # Serving: what a logged model takes, and how raw examples are given to it.
    @abstractmethod
    def signature(self) -> ModelSignature: ...

    @staticmethod
    @abstractmethod
    def serving_input(items: Sequence[Any]) -> Any:
        """Raw examples in the form the logged model's `predict` takes."""


MODALITIES: Registry[type[Modality]] = Registry("data.source")

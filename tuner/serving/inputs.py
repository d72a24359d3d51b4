"""What a logged model does with raw examples before its runtime sees them: the input pipeline
saved beside it (a tokenizer, or image normalisation), read without PyTorch.

Serving encodes and batches exactly as evaluation measured the point's accuracy (the same
tokens, the same batches trimmed to their longest example), so the validation set served gives
the logits that were measured: int8 activation ranges computed per call depend on the batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tuner.registry import Registry

# Examples per call; evaluation's batch size (`tuner.training.EVAL_BATCH_SIZE`).
BATCH_SIZE = 64

# A batch: the positions of its examples among those given, and the model's inputs for them.
InputBatch = tuple[np.ndarray, tuple[np.ndarray, ...]]


class ServingInputs(ABC):
    """One modality's input pipeline as a logged model runs it."""

    # What serving it needs installed besides numpy, pandas and MLflow.
    packages: ClassVar[tuple[str, ...]]

    @classmethod
    @abstractmethod
    def load(cls, directory: Path) -> ServingInputs:
        """The pipeline `tuner.modalities` saved in `directory`."""

    @abstractmethod
    def items_of(self, model_input: Any) -> Sequence[Any]:
        """The raw examples in a `predict` input; raises ValueError on a malformed one."""

    @abstractmethod
    def batches(self, items: Sequence[Any]) -> Iterator[InputBatch]:
        """The examples as model inputs, in the batches evaluation makes of them."""


SERVING_INPUTS: Registry[type[ServingInputs]] = Registry("data.source")

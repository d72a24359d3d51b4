"""What training, evaluation and deployment read, whatever the modality: batches of model
inputs (a tuple of tensors passed positionally to the model) with their labels."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Batch:
    inputs: tuple[torch.Tensor, ...]
    labels: torch.Tensor


class Encoded(Protocol):
    """A split encoded once per study (token ids, or normalised image tensors)."""

    labels: torch.Tensor

    def __len__(self) -> int: ...

    def batches(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> Iterator[Batch]: ...


def index_batches(
    size: int, batch_size: int, generator: torch.Generator | None
) -> Iterator[torch.Tensor]:
    """The example indices of each batch: in order, or shuffled by `generator`."""
    order = (
        torch.randperm(size, generator=generator) if generator is not None else torch.arange(size)
    )
    for start in range(0, size, batch_size):
        yield order[start : start + batch_size]

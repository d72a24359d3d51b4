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
    # Positions of the batch's examples in their split (batches grouped by length leave data
    # order, and whoever collects per-example outputs puts them back with this).
    index: torch.Tensor


class Encoded(Protocol):
    """A split encoded once per study (token ids, or normalised image tensors)."""

    labels: torch.Tensor

    def __len__(self) -> int: ...

    def batches(
        self,
        batch_size: int,
        generator: torch.Generator | None = None,
        group_by_length: bool = False,
    ) -> Iterator[Batch]:
        """In data order, or shuffled by `generator`; `group_by_length` puts examples of
        similar length together where examples differ in length (text), so batches trimmed to
        their longest example carry little padding."""
        ...


def index_batches(
    size: int, batch_size: int, generator: torch.Generator | None
) -> Iterator[torch.Tensor]:
    """The example indices of each batch: in order, or shuffled by `generator`."""
    order = (
        torch.randperm(size, generator=generator) if generator is not None else torch.arange(size)
    )
    for start in range(0, size, batch_size):
        yield order[start : start + batch_size]


# Examples sorted by length within windows of this many batches (the transformers Trainer's
# `group_by_length` uses the same width): wide enough that batches hold near-equal lengths. In
# a split larger than one window, which examples meet in a batch changes from epoch to epoch;
# in a smaller one only examples of equal length trade places.
GROUP_WINDOW_BATCHES = 50


def length_grouped_batches(
    lengths: torch.Tensor,
    batch_size: int,
    generator: torch.Generator | None,
    window_batches: int = GROUP_WINDOW_BATCHES,
) -> Iterator[torch.Tensor]:
    """Batches of examples of similar length. Without `generator`: all examples sorted by
    length (evaluation; deterministic). With it: shuffled, sorted by length within windows of
    `window_batches` batches (ties keep the shuffled order), and the batches themselves
    shuffled, so that an epoch does not run from long examples to short ones."""
    size = int(lengths.shape[0])
    if size == 0:
        return
    if generator is None:
        yield from torch.argsort(lengths, stable=True).split(batch_size)
        return
    order = torch.randperm(size, generator=generator)
    batches: list[torch.Tensor] = []
    for window in order.split(batch_size * window_batches):
        by_length = window[torch.argsort(lengths[window], descending=True, stable=True)]
        batches.extend(by_length.split(batch_size))
    for position in torch.randperm(len(batches), generator=generator).tolist():
        yield batches[position]


@dataclass(frozen=True)
class ExampleInputs:
    """Real inputs in the deployment's shape (for export and timing).

    Attributes:
        tensors: passed positionally to the model.
        names: one per tensor; the ONNX graph's input names.
        dynamic_axes: per name, the axes whose size may change between calls (ONNX export).
    """

    tensors: tuple[torch.Tensor, ...]
    names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]]

    def shape(self) -> str:
        """The tensors' shapes as recorded with a latency measurement, e.g. `1x1x28x28`."""
        return ", ".join("x".join(str(size) for size in t.shape) for t in self.tensors)

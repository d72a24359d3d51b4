"""Images normalised once per study, served as (N, C, H, W) float batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tuner.data.batches import Batch, index_batches


@dataclass(frozen=True)
class ImageTensors:
    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batches(
        self,
        batch_size: int,
        generator: torch.Generator | None = None,
        group_by_length: bool = False,
    ) -> Iterator[Batch]:
        """Every image has one size, so `group_by_length` changes nothing."""
        for index in index_batches(len(self), batch_size, generator):
            yield Batch((self.images[index],), self.labels[index], index)

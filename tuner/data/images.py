"""Images normalised once per study, served as (N, C, H, W) float batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tuner.data.batches import Batch, batch_order


@dataclass(frozen=True)
class ImageTensors:
    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batches(self, batch_size: int, generator: torch.Generator | None = None) -> Iterator[Batch]:
        order = batch_order(len(self), generator)
        for start in range(0, len(self), batch_size):
            index = order[start : start + batch_size]
            yield Batch((self.images[index],), self.labels[index])

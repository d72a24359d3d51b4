"""Texts tokenized once per study, served as batches trimmed to their longest example."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tuner.data.batches import Batch, index_batches, length_grouped_batches


@dataclass(frozen=True)
class TokenizedTexts:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batches(
        self,
        batch_size: int,
        generator: torch.Generator | None = None,
        group_by_length: bool = False,
    ) -> Iterator[Batch]:
        """Batches of (input_ids, attention_mask); padding beyond each batch is dropped."""
        indices = (
            length_grouped_batches(self.attention_mask.sum(dim=1), batch_size, generator)
            if group_by_length
            else index_batches(len(self), batch_size, generator)
        )
        for index in indices:
            mask = self.attention_mask[index]
            length = max(int(mask.sum(dim=1).max()), 1)
            inputs = (self.input_ids[index, :length], mask[:, :length])
            yield Batch(inputs, self.labels[index], index)


def tokenize_texts(
    tokenizer, texts: list[str], max_length: int, labels: list[int] | None = None
) -> TokenizedTexts:
    """Texts as the model sees them in training, evaluation and serving alike; unlabelled
    texts (serving) get label 0, which nothing reads."""
    encoded = tokenizer(
        texts,
        padding="max_length",
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    targets = (
        torch.tensor(labels) if labels is not None else torch.zeros(len(texts), dtype=torch.long)
    )
    return TokenizedTexts(encoded["input_ids"], encoded["attention_mask"], targets)

"""Logits and accuracy of any callable that maps model inputs to logits, batched alike
wherever a model is evaluated (training, deployment checks, serving)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tuner.data import Encoded

Logits = Callable[..., torch.Tensor]

# Validation, deployment checks and serving all batch examples alike: int8 backends quantise
# activations with ranges of the whole batch, and text batches are trimmed to their longest
# example, so the same examples in other batches can give other logits. Texts are batched
# sorted by length: the batches then carry almost no padding.
EVAL_BATCH_SIZE = 64


@torch.inference_mode()
def collect_logits(
    logits_of: Logits, data: Encoded, batch_size: int = EVAL_BATCH_SIZE
) -> torch.Tensor:
    """Logits of any callable mapping model inputs to logits, in data order."""
    logits: torch.Tensor | None = None
    for batch in data.batches(batch_size, group_by_length=True):
        output = logits_of(*batch.inputs).float()
        if logits is None:
            logits = output.new_empty((len(data), *output.shape[1:]))
        logits[batch.index] = output
    return logits if logits is not None else torch.empty(0, 0)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(dim=-1) == labels).float().mean()) if len(labels) else 0.0


def evaluate(logits_of: Logits, data: Encoded, batch_size: int = EVAL_BATCH_SIZE) -> float:
    """Accuracy of any callable mapping model inputs to logits."""
    return accuracy(collect_logits(logits_of, data, batch_size), data.labels)

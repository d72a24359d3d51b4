"""Knowledge distillation (Hinton et al., 2015): the student also learns the teacher's softened
output distribution, and for transformers optionally its hidden states (as TinyBERT does).

loss = (1 - alpha) * hard + alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T))
       + hidden_weight * mean over the student's layers of MSE(student layer i, teacher layer i)

`hard` is the batch's own loss (mixed labels included); the T^2 factor keeps the soft term's
gradients on the scale of the hard one's whatever the temperature. A mixed batch is shown to
the teacher mixed the same way. An unmixed batch's teacher logits depend on its examples only
(the teacher runs in eval mode), so they are computed once per training set and looked up.
Depth edits keep the bottom layers, so student layer i is teacher layer i; the hidden-state
term compares real tokens only (padding left out), of the unmixed inputs (text mixup mixes
pooled representations, after every layer).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from tuner.data import Batch, Encoded
from tuner.training.evaluation import collect_logits
from tuner.training.mixing import BatchOutput


def soft_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(teacher || student) of the temperature-softened distributions, batch mean."""
    kl = nn.functional.kl_div(
        nn.functional.log_softmax(student / temperature, dim=-1),
        nn.functional.log_softmax(teacher / temperature, dim=-1),
        reduction="batchmean",
        log_target=True,
    )
    return kl * temperature**2


def hidden_loss(
    student: list[torch.Tensor], teacher: list[torch.Tensor], attention_mask: torch.Tensor
) -> torch.Tensor:
    """Mean over the student's layers of the mean squared difference of hidden states over
    real tokens."""
    mask = attention_mask.unsqueeze(-1).to(student[0].dtype)
    tokens = mask.sum() * student[0].shape[-1]
    per_layer = [
        (((s - t) ** 2) * mask).sum() / tokens for s, t in zip(student, teacher, strict=False)
    ]
    return torch.stack(per_layer).mean()


class LayerOutputs:
    """The hidden states each transformer layer of a model output in its last forward pass,
    kept by a forward hook on every layer while `watching`."""

    def __init__(self, model: nn.Module) -> None:
        from tuner.edits import find_layer_stack

        _, _, self.layers = find_layer_stack(model, "distill.hidden_weight")
        self.states: list[torch.Tensor] = []

    def _keep(self, module: nn.Module, args, output) -> None:
        if module is self.layers[0]:
            self.states = []  # a new pass: only the last one is kept
        self.states.append(output[0] if isinstance(output, tuple) else output)

    @contextmanager
    def watching(self) -> Iterator[LayerOutputs]:
        handles = [layer.register_forward_hook(self._keep) for layer in self.layers]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
            self.states = []

    def taken(self) -> list[torch.Tensor]:
        """The states of the last pass, one per layer, and forget them."""
        states, self.states = self.states, []
        return states


@dataclass
class Distillation:
    """A teacher, the loss weights, and the teacher's logits of the training set's examples
    in data order (for unmixed batches)."""

    teacher: nn.Module
    alpha: float
    temperature: float
    train_logits: torch.Tensor
    hidden_weight: float = 0.0
    _student_layers: LayerOutputs | None = field(default=None, repr=False)

    @classmethod
    def of(
        cls, teacher: nn.Module, alpha: float, temperature: float, train_data: Encoded
    ) -> Distillation:
        teacher.eval()
        return cls(teacher, alpha, temperature, collect_logits(teacher, train_data))

    @contextmanager
    def teaching(self, student: nn.Module) -> Iterator[None]:
        """While the student trains: its layers' outputs are kept for the hidden-state term
        (the hooks are gone afterwards, before the model is deployed)."""
        if self.hidden_weight <= 0:
            yield
            return
        self._student_layers = LayerOutputs(student)
        try:
            with self._student_layers.watching():
                yield
        finally:
            self._student_layers = None

    def loss(self, output: BatchOutput, batch: Batch) -> torch.Tensor:
        if output.mixed_logits_of is None:
            teacher_logits = self.train_logits[batch.index].to(output.logits.device)
        else:
            with torch.no_grad():
                teacher_logits = output.mixed_logits_of(self.teacher).float()
        soft = soft_loss(output.logits, teacher_logits, self.temperature)
        loss = (1 - self.alpha) * output.loss + self.alpha * soft
        if self._student_layers is None:
            return loss
        student_states = self._student_layers.taken()
        teacher_layers = LayerOutputs(self.teacher)
        with teacher_layers.watching(), torch.no_grad():
            self.teacher(*batch.inputs)
            teacher_states = teacher_layers.taken()
        _, attention_mask = batch.inputs
        return loss + self.hidden_weight * hidden_loss(
            student_states, teacher_states, attention_mask
        )

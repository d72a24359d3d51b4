"""Prune attention heads, keeping in every layer the heads that contribute most to its output.

A BERT-style self-attention projects its input to queries, keys and values, `heads` slices of
`head_size` each, attends within each slice, and `attention.output.dense` mixes the slices back.
Head h owns rows [h * head_size, (h + 1) * head_size) of the query, key and value projections
and the same columns of the output projection: dropping it slices all four, which leaves every
other head's weights and computation exactly as they were (softmax is taken per head). The
scaling stays 1 / sqrt(head_size), since a head's size does not change. transformers 5 no
longer ships `prune_heads`, so this is done here, as the FFN edit is.

Which heads go is measured on training inputs: a head's importance is the mean norm, over the
real (not padding) tokens, of what it adds to the attention output (its slice of the context
times its columns of the output projection; Kobayashi et al., 2020, "Attention is not only a
weight"). It needs no labels, so it ranks a pretrained encoder's heads before its classifier is
trained, and the teacher's for students that start from it. Without inputs (an artifact's
architecture rebuilt, an untrained model timed) the first heads are kept: only the shapes
matter there, and they are the same. Each layer's attention records which of its original heads
it holds (`kept_heads`).

`model.num_heads` keeps that many heads in every layer; `model.num_heads_fraction` a fraction
of the model's own, so one search space serves encoders of any head count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tuner.edits.base import EDITS, Edit, checked_fraction, half_up, sliced_linear
from tuner.errors import ConfigError


@dataclass(frozen=True)
class SelfAttention:
    """One layer's attention: `attention.self` (query, key, value) and `attention.output`."""

    attention: nn.Module

    @property
    def heads_module(self) -> nn.Module:
        return self.attention.self

    @property
    def out(self) -> nn.Linear:
        return self.attention.output.dense

    @property
    def heads(self) -> int:
        return int(self.heads_module.num_attention_heads)

    @property
    def head_size(self) -> int:
        return int(self.heads_module.attention_head_size)

    @property
    def kept(self) -> list[int]:
        """Which of the layer's original heads it holds, in order."""
        return list(getattr(self.heads_module, "kept_heads", range(self.heads)))


def _is_self_attention(module: nn.Module) -> bool:
    heads = getattr(module, "self", None)
    out = getattr(getattr(module, "output", None), "dense", None)
    projections = [getattr(heads, name, None) for name in ("query", "key", "value")]
    return (
        all(isinstance(p, nn.Linear) for p in projections)
        and isinstance(out, nn.Linear)
        and hasattr(heads, "num_attention_heads")
        and hasattr(heads, "attention_head_size")
    )


def find_self_attentions(model: nn.Module) -> list[SelfAttention]:
    """Every BERT-style attention block, in layer order."""
    return [SelfAttention(m) for m in model.modules() if _is_self_attention(m)]


def _self_attentions_for(model: nn.Module, key: str) -> list[SelfAttention]:
    blocks = find_self_attentions(model)
    if not blocks:
        config = getattr(getattr(model, "encoder", model), "config", None)
        name = getattr(config, "name_or_path", None) or type(model).__name__
        raise ConfigError(
            f"Invalid config: key 'model.{key}': the model '{name}' has no BERT-style "
            "self-attention whose heads can be pruned (attention.self.query/key/value -> "
            "attention.output.dense)"
        )
    return blocks


def attention_heads(model: nn.Module) -> int | None:
    """The heads of the model's widest attention layer; None without BERT-style attention."""
    blocks = find_self_attentions(model)
    return max(block.heads for block in blocks) if blocks else None


def head_importance(
    model: nn.Module, inputs: Sequence[tuple[torch.Tensor, ...]]
) -> list[torch.Tensor]:
    """Per layer, each head's mean output norm over the real tokens of `inputs` (batches of
    the model's inputs, the attention mask second)."""
    blocks = find_self_attentions(model)
    totals = [torch.zeros(block.heads, dtype=torch.float64) for block in blocks]
    mask: list[torch.Tensor] = []

    def recorder(index: int, block: SelfAttention):
        def record(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            context = args[0].unflatten(-1, (block.heads, block.head_size))
            columns = block.out.weight.unflatten(1, (block.heads, block.head_size))
            norms = torch.einsum("bthd,ohd->btho", context, columns).norm(dim=-1)
            totals[index] += (norms * mask[0].unsqueeze(-1)).sum(dim=(0, 1)).double()

        return record

    hooks = [
        block.out.register_forward_pre_hook(recorder(i, block)) for i, block in enumerate(blocks)
    ]
    training = model.training
    tokens = 0.0
    try:
        model.eval()
        with torch.no_grad():
            for batch in inputs:
                real = batch[1] if len(batch) > 1 else torch.ones(batch[0].shape[:2])
                mask[:] = [real.to(torch.float32)]
                tokens += float(real.sum())
                model(*batch)
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    return [total / max(tokens, 1.0) for total in totals]


def _keep_heads(block: SelfAttention, keep: torch.Tensor) -> None:
    """Slice the block to the heads `keep` (positions among those it holds now)."""
    size = block.head_size
    rows = (keep.unsqueeze(1) * size + torch.arange(size)).flatten()
    heads = block.heads_module
    kept = [block.kept[i] for i in keep.tolist()]
    for name in ("query", "key", "value"):
        setattr(heads, name, sliced_linear(getattr(heads, name), rows, dim=0))
    block.attention.output.dense = sliced_linear(block.out, rows, dim=1)
    heads.num_attention_heads = len(keep)
    heads.all_head_size = len(keep) * size
    heads.kept_heads = kept


def prune_heads(
    model: nn.Module, count: int, inputs: Sequence[tuple[torch.Tensor, ...]] | None = None
) -> None:
    """Keep `count` heads in every attention layer of `model`, in place: the most important
    on `inputs` (`head_importance`), or the first ones without inputs."""
    blocks = _self_attentions_for(model, "num_heads")
    most = max(block.heads for block in blocks)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= most:
        raise ConfigError(
            f"Invalid config: key 'model.num_heads': {count!r} must be an int in [1, {most}] "
            "(heads kept in every layer)"
        )
    importance = head_importance(model, inputs) if inputs else None
    for index, block in enumerate(blocks):
        if count >= block.heads:
            continue
        if importance is None:
            keep = torch.arange(count)
        else:
            keep = importance[index].topk(count).indices.sort().values
        _keep_heads(block, keep)


EDITS.register("num_heads")(
    Edit(config_key="num_heads", apply=prune_heads, reads=attention_heads, measured=True)
)


def num_heads_of(model: nn.Module, fraction: float) -> int:
    """The head count `fraction` of the model's own stands for, rounded half up, at least 1
    (12 x 0.5 -> 6, 12 x 2/3 -> 8, 4 x 0.6 -> 2)."""
    key = "num_heads_fraction"
    blocks = _self_attentions_for(model, key)
    most = max(block.heads for block in blocks)
    return max(1, half_up(checked_fraction(key, fraction, "attention heads") * most))


def prune_heads_to_fraction(
    model: nn.Module, fraction: float, inputs: Sequence[tuple[torch.Tensor, ...]] | None = None
) -> None:
    prune_heads(model, num_heads_of(model, fraction), inputs)


EDITS.register("num_heads_fraction")(
    Edit(
        config_key="num_heads_fraction",
        apply=prune_heads_to_fraction,
        resolves=("num_heads", num_heads_of),
        measured=True,
    )
)


def kept_heads(model: nn.Module) -> list[list[int]] | None:
    """Per attention layer, which of its original heads it holds; None where no layer has
    lost any (or the model has no BERT-style attention)."""
    blocks = find_self_attentions(model)
    kept = [block.kept for block in blocks]
    return kept if any(hasattr(b.heads_module, "kept_heads") for b in blocks) else None

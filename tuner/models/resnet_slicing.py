"""A narrower or shallower timm ResNet takes a trained one's weights (a distilled student that
starts from its teacher, `train.distill.start_from: teacher`).

Each stage keeps its first blocks (the teacher's bottom ones, as depth edits of transformers
keep the bottom layers) and its most important channels. A channel's importance is the size of
the batch-norm scale that gates it (network slimming, Liu et al. 2017): the output channels of a
stage are shared by every block's residual branch and shortcut, so they are chosen once per
stage by the scales of the kept blocks' last norms and projection shortcuts; the channels inside
a block are chosen by the norm that follows their convolution. The stem is not widened or
narrowed by `model.width_multiplier` and is copied as it is, the classifier keeps its columns of
the last stage's kept channels. Kept weights keep their order, so a student of the teacher's own
size is an exact copy.

Shortcuts may differ in kind where a stage's input is the stem's (whose width stays): where the
teacher's first stage adds its input unchanged and the narrower student's needs a projection
(basic blocks), the projection is made to select the kept channels (a 1x1 selection, its norm
at the identity when evaluating; in training it standardises what it passes, as any batch
norm). Where the teacher's projects and the student's adds its input unchanged (bottleneck
blocks at a quarter width: 64 channels in and out), the teacher's projection has no place in
the student and its channels are added as they come: training has to pair them again.
"""

from __future__ import annotations

import torch
from torch import nn

_STAGES = ("layer1", "layer2", "layer3", "layer4")


def inherit_resnet(teacher: nn.Module, student: nn.Module) -> None:
    """Fill `student` with `teacher`'s weights, both timm ResNets of one block type; ValueError
    naming what does not fit (a stage wider or deeper than the teacher's, other layers)."""
    written: set[int] = set()
    with torch.no_grad():
        for name, module in student.named_children():
            if name not in (*_STAGES, "fc"):
                _copy_whole(getattr(teacher, name), module, name, written)
        # The stem is the same in both (copied above): every one of its channels goes on.
        previous = torch.arange(teacher.bn1.num_features)
        for name in _STAGES:
            previous = _inherit_stage(
                getattr(teacher, name), getattr(student, name), name, previous, written
            )
        _copy_linear_columns(teacher.fc, student.fc, previous, written)
    missed = [name for name, tensor in _tensors(student) if id(tensor) not in written]
    if missed:
        more = f" and {len(missed) - 3} more" if len(missed) > 3 else ""
        raise ValueError(f"no teacher weights for {', '.join(missed[:3])}{more}")


def _tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(), *module.named_buffers()]


def _top(importance: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` most important channels, in their original order."""
    return importance.topk(count).indices.sort().values


def _copy_whole(teacher: nn.Module, student: nn.Module, name: str, written: set[int]) -> None:
    theirs = dict(_tensors(teacher))
    for key, tensor in _tensors(student):
        source = theirs.get(key)
        if source is None or source.shape != tensor.shape:
            raise ValueError(f"{name}.{key} has no counterpart of its shape in the teacher")
    _copy_tensors(teacher, student, None, written)


def _convs_and_norms(block: nn.Module) -> list[tuple[nn.Conv2d, nn.BatchNorm2d]]:
    """The residual branch's (convolution, norm) pairs in order: two in a basic block, three in
    a bottleneck."""
    pairs = []
    for index in (1, 2, 3):
        conv, norm = getattr(block, f"conv{index}", None), getattr(block, f"bn{index}", None)
        if conv is None:
            break
        if not isinstance(conv, nn.Conv2d) or not isinstance(norm, nn.BatchNorm2d):
            raise ValueError(f"{type(block).__name__} is not a plain conv/batch-norm block")
        pairs.append((conv, norm))
    return pairs


def _projection(block: nn.Module) -> tuple[nn.Conv2d, nn.BatchNorm2d] | None:
    """The shortcut's convolution and norm (timm may put a pooling before them)."""
    shortcut = getattr(block, "downsample", None)
    if shortcut is None:
        return None
    convs = [m for m in shortcut.modules() if isinstance(m, nn.Conv2d)]
    norms = [m for m in shortcut.modules() if isinstance(m, nn.BatchNorm2d)]
    if len(convs) != 1 or len(norms) != 1:
        raise ValueError(f"the shortcut {type(shortcut).__name__} is not one conv and one norm")
    return convs[0], norms[0]


def _inherit_stage(
    teacher: nn.Sequential,
    student: nn.Sequential,
    name: str,
    previous: torch.Tensor,
    written: set[int],
) -> torch.Tensor:
    """Copy a stage's kept blocks and channels; returns the teacher's channels it kept."""
    if len(student) > len(teacher):
        raise ValueError(f"{name} has {len(student)} blocks, the teacher's only {len(teacher)}")
    kept = list(teacher)[: len(student)]
    width = _convs_and_norms(student[-1])[-1][1].num_features
    available = _convs_and_norms(kept[-1])[-1][1].num_features
    if width > available:
        raise ValueError(f"{name} has {width} channels, the teacher's only {available}")
    importance = torch.zeros_like(_convs_and_norms(kept[-1])[-1][1].weight)
    for block in kept:
        importance += _convs_and_norms(block)[-1][1].weight.abs()
        projection = _projection(block)
        if projection is not None:
            importance += projection[1].weight.abs()
    channels = _top(importance, width)
    for index, (theirs, mine) in enumerate(zip(kept, student, strict=True)):
        _inherit_block(theirs, mine, f"{name}.{index}", previous, channels, written)
        previous = channels
    return channels


def _inherit_block(
    teacher: nn.Module,
    student: nn.Module,
    name: str,
    inputs: torch.Tensor,
    outputs: torch.Tensor,
    written: set[int],
) -> None:
    theirs, mine = _convs_and_norms(teacher), _convs_and_norms(student)
    if len(theirs) != len(mine):
        raise ValueError(
            f"{name} is a {type(student).__name__}, the teacher's a {type(teacher).__name__}"
        )
    into = inputs
    for position, ((t_conv, t_norm), (s_conv, s_norm)) in enumerate(zip(theirs, mine, strict=True)):
        last = position == len(mine) - 1
        out = outputs if last else _top(t_norm.weight.abs(), s_norm.num_features)
        _copy_conv(t_conv, s_conv, out, into, written)
        _copy_tensors(t_norm, s_norm, out, written)
        into = out
    _inherit_shortcut(teacher, student, inputs, outputs, written)


def _inherit_shortcut(
    teacher: nn.Module,
    student: nn.Module,
    inputs: torch.Tensor,
    outputs: torch.Tensor,
    written: set[int],
) -> None:
    theirs, mine = _projection(teacher), _projection(student)
    if mine is None:  # nothing to fill (see the module's docstring where theirs projects)
        return
    conv, norm = mine
    if theirs is not None:
        _copy_conv(theirs[0], conv, outputs, inputs, written)
        _copy_tensors(theirs[1], norm, outputs, written)
        return
    # The teacher's shortcut is the identity: input channel c is output channel c.
    selection = (outputs[:, None] == inputs[None, :]).to(conv.weight.dtype)
    conv.weight.copy_(selection.reshape(conv.weight.shape))
    written.add(id(conv.weight))
    if conv.bias is not None:
        conv.bias.zero_()
        written.add(id(conv.bias))
    norm.reset_parameters()
    written.update(id(tensor) for _, tensor in _tensors(norm))


def _copy_conv(
    teacher: nn.Conv2d,
    student: nn.Conv2d,
    outputs: torch.Tensor,
    inputs: torch.Tensor,
    written: set[int],
) -> None:
    if student.groups != 1 or teacher.groups != 1:
        raise ValueError("grouped convolutions cannot be narrowed channel by channel")
    weight = teacher.weight.index_select(0, outputs).index_select(1, inputs)
    if weight.shape != student.weight.shape:
        raise ValueError(
            f"a convolution of shape {tuple(student.weight.shape)} has no counterpart in the "
            f"teacher's {tuple(teacher.weight.shape)}"
        )
    student.weight.copy_(weight)
    written.add(id(student.weight))
    if student.bias is not None and teacher.bias is not None:
        student.bias.copy_(teacher.bias.index_select(0, outputs))
        written.add(id(student.bias))


def _copy_tensors(
    teacher: nn.Module, student: nn.Module, channels: torch.Tensor | None, written: set[int]
) -> None:
    """Every tensor of `student` from the same-named one of `teacher`, its first dimension cut
    to `channels` (all of it when None; counters, without dimensions, as they are)."""
    theirs = dict(_tensors(teacher))
    for key, tensor in _tensors(student):
        source = theirs[key]
        tensor.copy_(source if channels is None or source.dim() == 0 else source[channels])
        written.add(id(tensor))


def _copy_linear_columns(
    teacher: nn.Linear, student: nn.Linear, inputs: torch.Tensor, written: set[int]
) -> None:
    if student.out_features != teacher.out_features:
        raise ValueError(
            f"the classifier predicts {student.out_features} labels, the teacher's "
            f"{teacher.out_features}"
        )
    student.weight.copy_(teacher.weight.index_select(1, inputs))
    written.add(id(student.weight))
    if student.bias is not None:
        student.bias.copy_(teacher.bias)
        written.add(id(student.bias))

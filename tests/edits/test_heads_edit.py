"""Pruning attention heads: which heads stay is measured on inputs, the heads kept compute what
they computed before, and the edit's keys resolve and refuse as the other edits' do."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import FOUR_HEAD_BERT, PRUNED_BERT, REPO
from omegaconf import OmegaConf

from tuner.edits import apply_edits, architecture_of, find_self_attentions, kept_heads
from tuner.edits.heads import head_importance
from tuner.errors import ConfigError


def _inputs(batches: int = 2, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of 8 random texts of 12 token ids, every other one padded after 7."""
    generator = torch.Generator().manual_seed(seed)
    found = []
    for _ in range(batches):
        ids = torch.randint(1, 100, (8, 12), generator=generator)
        mask = torch.ones(8, 12, dtype=torch.long)
        mask[::2, 7:] = 0
        found.append((ids, mask))
    return found


@pytest.fixture
def four_heads() -> torch.nn.Module:
    torch.manual_seed(0)
    return FOUR_HEAD_BERT.build()


def _scale_heads(model: torch.nn.Module, factors: list[list[float]]) -> None:
    """Multiply each head's columns of each layer's output projection by its factor."""
    for block, layer_factors in zip(find_self_attentions(model), factors, strict=True):
        size = block.head_size
        with torch.no_grad():
            for head, factor in enumerate(layer_factors):
                block.out.weight[:, head * size : (head + 1) * size] *= factor


def test_the_heads_kept_are_those_that_add_most_to_the_output(four_heads):
    # Layer 0's heads 0 and 2, layer 1's heads 1 and 3 scaled up 100x, the others down 100x:
    # whatever the context, those two add the most to their layer's output.
    _scale_heads(four_heads, [[100, 0.01, 100, 0.01], [0.01, 100, 0.01, 100]])
    apply_edits(four_heads, OmegaConf.create({"num_heads": 2}), _inputs())
    assert kept_heads(four_heads) == [[0, 2], [1, 3]]
    for block in find_self_attentions(four_heads):
        assert block.heads == 2 and block.heads_module.all_head_size == 16
        assert block.out.in_features == 16
        for name in ("query", "key", "value"):
            assert getattr(block.heads_module, name).out_features == 16


def test_importance_is_the_mean_output_norm_of_a_head_over_real_tokens(four_heads):
    """Worked out by hand on one layer: with the output projection's columns of head h set to
    c_h times the identity's rows for that slice, a token's contribution from head h is c_h
    times its context slice, so the importance is c_h times the slice's mean norm."""
    block = find_self_attentions(four_heads)[0]
    size = block.head_size
    scales = [1.0, 2.0, 3.0, 4.0]
    contexts: list[torch.Tensor] = []
    block.out.register_forward_pre_hook(lambda module, args: contexts.append(args[0]))
    with torch.no_grad():
        block.out.weight.zero_()
        for head, scale in enumerate(scales):
            rows = slice(head * size, (head + 1) * size)
            block.out.weight[rows, rows] = scale * torch.eye(size)
    inputs = _inputs(batches=1)
    importance = head_importance(four_heads, inputs)[0]
    # The context the hook saw, kept for real tokens only.
    real = inputs[0][1].bool()
    context = contexts[0][real]  # (real tokens, 4 x 8)
    for head, scale in enumerate(scales):
        expected = scale * context[:, head * size : (head + 1) * size].norm(dim=-1).mean()
        assert float(importance[head]) == pytest.approx(float(expected), rel=1e-5)


def test_the_pruned_model_computes_the_original_without_the_dropped_heads(four_heads):
    inputs = _inputs()
    pruned = copy.deepcopy(four_heads)
    apply_edits(pruned, OmegaConf.create({"num_heads": 3}), inputs)
    kept = kept_heads(pruned)
    assert kept is not None and [len(layer) for layer in kept] == [3, 3]
    # The original with the dropped heads' contributions removed: their columns of the output
    # projection zeroed.
    removed = copy.deepcopy(four_heads)
    for block, layer in zip(find_self_attentions(removed), kept, strict=True):
        size = block.head_size
        with torch.no_grad():
            for head in set(range(4)) - set(layer):
                block.out.weight[:, head * size : (head + 1) * size] = 0
    pruned.eval()
    removed.eval()
    with torch.no_grad():
        for ids, mask in inputs:
            torch.testing.assert_close(pruned(ids, mask), removed(ids, mask))


def test_without_inputs_the_first_heads_are_kept_in_the_same_shapes(four_heads):
    measured = copy.deepcopy(four_heads)
    apply_edits(measured, OmegaConf.create({"num_heads": 3}), _inputs())
    positional = copy.deepcopy(four_heads)
    apply_edits(positional, OmegaConf.create({"num_heads": 3}))
    assert kept_heads(positional) == [[0, 1, 2], [0, 1, 2]]
    shapes = {name: tensor.shape for name, tensor in measured.state_dict().items()}
    assert shapes == {name: tensor.shape for name, tensor in positional.state_dict().items()}
    # An artifact's recipe rebuilds the architecture, which the measured weights fill.
    rebuilt = PRUNED_BERT.build()
    rebuilt.load_state_dict(measured.state_dict())
    ids, mask = _inputs(batches=1)[0]
    measured.eval()
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids, mask), measured(ids, mask))


def test_all_the_heads_keep_the_model_as_it_was(four_heads):
    edited = copy.deepcopy(four_heads)
    apply_edits(edited, OmegaConf.create({"num_heads": 4}), _inputs())
    assert kept_heads(edited) is None
    for (name, before), after in zip(
        four_heads.state_dict().items(), edited.state_dict().values(), strict=True
    ):
        assert torch.equal(before, after), name


@pytest.mark.parametrize(
    ("fraction", "heads"), [(1.0, 4), (0.75, 3), (0.6, 2), (0.5, 2), (0.3, 1), (0.01, 1)]
)
def test_a_heads_fraction_keeps_that_share_of_the_models_own_heads(four_heads, fraction, heads):
    # 4 x 0.6 = 2.4 -> 2; 4 x 0.3 = 1.2 -> 1; never fewer than one head.
    edits = OmegaConf.create({"num_heads_fraction": fraction})
    assert architecture_of(four_heads, edits)["model.num_heads"] == heads
    apply_edits(four_heads, edits, _inputs())
    assert [block.heads for block in find_self_attentions(four_heads)] == [heads, heads]


@pytest.mark.parametrize("heads", [0, 5, 2.5, True, "3"])
def test_a_head_count_the_model_cannot_keep_names_the_key(four_heads, heads):
    with pytest.raises(ConfigError, match=r"key 'model.num_heads': .* must be an int in \[1, 4\]"):
        apply_edits(four_heads, OmegaConf.create({"num_heads": heads}), _inputs())


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_a_fraction_that_leaves_no_head_or_too_many_names_the_key(four_heads, fraction):
    with pytest.raises(ConfigError, match="key 'model.num_heads_fraction'"):
        apply_edits(four_heads, OmegaConf.create({"num_heads_fraction": fraction}))


def test_a_model_without_prunable_attention_names_the_key_and_the_model():
    from tuner.models import build_model

    cfg = OmegaConf.merge(
        OmegaConf.load(REPO / "conf" / "model" / "resnet.yaml"), {"width_multiplier": 0.25}
    )
    resnet = build_model(cfg, 3)
    for key, value in (("num_heads", 2), ("num_heads_fraction", 0.5)):
        with pytest.raises(ConfigError, match=rf"key 'model.{key}': the model '\w+' has no"):
            apply_edits(resnet, OmegaConf.create({key: value}))


def test_students_prune_the_teachers_heads(four_heads):
    """A student cut from a teacher ranks the teacher's heads: scaled as in the hand-built
    case, the teacher's important heads are the ones every student keeps."""
    from tuner.trial.students import student_of

    _scale_heads(four_heads, [[0.01, 100, 100, 0.01], [100, 0.01, 0.01, 100]])
    student = student_of(
        four_heads,
        OmegaConf.create({**PRUNED_BERT.model, "num_heads": 2}),
        FOUR_HEAD_BERT.build,
        _inputs(),
    )
    assert kept_heads(student) == [[1, 2], [0, 3]]
    assert kept_heads(four_heads) is None  # the teacher is left as it was

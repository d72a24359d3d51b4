from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from tuner.edits import apply_edits
from tuner.edits.ffn_width import find_feed_forwards, shrink_ffn
from tuner.errors import ConfigError


def _inputs():
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 100, (4, 12), generator=generator), torch.ones(4, 12, dtype=torch.long)


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_shrink_keeps_shapes_and_drops_parameters(tiny_bert):
    ids, mask = _inputs()
    before = _n_params(tiny_bert)
    shrink_ffn(tiny_bert, 512)
    blocks = find_feed_forwards(tiny_bert)
    assert len(blocks) == 2
    for block in blocks:
        assert block.up.weight.shape == (512, 32)
        assert block.down.weight.shape == (32, 512)
    assert tiny_bert.encoder.config.intermediate_size == 512
    # Each layer loses 1024 neurons: 32 weights in, 32 out and one bias.
    assert before - _n_params(tiny_bert) == 2 * 1024 * (32 + 32 + 1)
    assert tiny_bert(ids, mask).shape == (4, 2)


def test_full_width_is_identity(tiny_bert):
    ids, mask = _inputs()
    edited = copy.deepcopy(tiny_bert)
    shrink_ffn(edited, 1536)
    assert torch.equal(edited(ids, mask), tiny_bert(ids, mask))
    for a, b in zip(edited.state_dict().values(), tiny_bert.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_keeps_the_most_important_neurons(tiny_bert):
    block = find_feed_forwards(tiny_bert)[0]
    with torch.no_grad():
        block.up.weight[7] *= 100.0  # neuron 7 becomes the most important one
    expected_row = block.up.weight[7].clone()
    shrink_ffn(tiny_bert, 4)
    kept = find_feed_forwards(tiny_bert)[0].up.weight
    assert any(torch.equal(row, expected_row) for row in kept)


def test_removing_few_neurons_changes_little(tiny_bert):
    ids, mask = _inputs()
    edited = copy.deepcopy(tiny_bert)
    shrink_ffn(edited, 1500)
    with torch.no_grad():
        original = tiny_bert.embed(ids, mask)
        shrunk = edited.embed(ids, mask)
        pruned_hard = copy.deepcopy(tiny_bert)
        shrink_ffn(pruned_hard, 64)
        far = pruned_hard.embed(ids, mask)
    small = (shrunk - original).norm() / original.norm()
    assert small < 0.05
    assert small < (far - original).norm() / original.norm()


@pytest.mark.parametrize("width", [0, 2000, 1.5])
def test_bad_width_names_the_key(tiny_bert, width):
    with pytest.raises(ConfigError, match="'model.ffn_width'"):
        shrink_ffn(tiny_bert, width)


def test_apply_edits_runs_only_set_keys(tiny_bert):
    assert apply_edits(tiny_bert, OmegaConf.create({"ffn_width": None})) == []
    assert apply_edits(tiny_bert, OmegaConf.create({"ffn_width": 256})) == ["model.ffn_width"]
    assert find_feed_forwards(tiny_bert)[0].width == 256


def test_model_without_ffn_blocks_is_rejected():
    with pytest.raises(ConfigError, match="no BERT-style FFN"):
        shrink_ffn(torch.nn.Sequential(torch.nn.Linear(4, 4)), 2)

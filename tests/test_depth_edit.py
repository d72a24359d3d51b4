from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from tuner.edits import EDITS, apply_edits
from tuner.edits.depth import find_layer_stack, keep_bottom_layers
from tuner.errors import ConfigError


def _inputs():
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 100, (3, 10), generator=generator), torch.ones(3, 10, dtype=torch.long)


def test_keeps_the_bottom_layers_with_their_weights(tiny_bert):
    bottom = copy.deepcopy(find_layer_stack(tiny_bert)[2][0])
    keep_bottom_layers(tiny_bert, 1)
    stack = find_layer_stack(tiny_bert)[2]
    assert len(stack) == 1
    assert tiny_bert.encoder.config.num_hidden_layers == 1
    for a, b in zip(stack[0].state_dict().values(), bottom.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    ids, mask = _inputs()
    assert tiny_bert(ids, mask).shape == (3, 2)


def test_full_depth_is_identity(tiny_bert):
    ids, mask = _inputs()
    edited = copy.deepcopy(tiny_bert)
    keep_bottom_layers(edited, 2)
    assert torch.equal(edited(ids, mask), tiny_bert(ids, mask))


@pytest.mark.parametrize("layers", [0, 3, 1.5])
def test_bad_depth_names_the_key(tiny_bert, layers):
    with pytest.raises(ConfigError, match="'model.num_layers'"):
        keep_bottom_layers(tiny_bert, layers)


def test_both_edits_apply_together(tiny_bert):
    applied = apply_edits(tiny_bert, OmegaConf.create({"ffn_width": 256, "num_layers": 1}))
    assert sorted(applied) == ["model.ffn_width", "model.num_layers"]
    assert set(EDITS.names()) == {"ffn_width", "num_layers"}
    layer = find_layer_stack(tiny_bert)[2][0]
    assert len(find_layer_stack(tiny_bert)[2]) == 1
    assert layer.intermediate.dense.out_features == 256

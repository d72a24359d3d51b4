from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from tuner.edits import EDITS, apply_edits, resolved_edits
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
    assert set(EDITS.names()) == {
        "ffn_width",
        "num_layers",
        "num_heads",
        "ffn_width_fraction",
        "num_layers_fraction",
        "num_heads_fraction",
    }
    layer = find_layer_stack(tiny_bert)[2][0]
    assert len(find_layer_stack(tiny_bert)[2]) == 1
    assert layer.intermediate.dense.out_features == 256


@pytest.mark.parametrize(
    ("fraction", "layers"), [(0.5, 1), (0.667, 1), (0.75, 2), (0.833, 2), (1.0, 2)]
)
def test_a_depth_fraction_keeps_that_share_of_the_models_own_layers(tiny_bert, fraction, layers):
    # The tiny BERT has 2 layers: 2 x fraction rounded half up, at least one.
    assert resolved_edits(tiny_bert, OmegaConf.create({"num_layers_fraction": fraction})) == {
        "model.num_layers": layers
    }
    apply_edits(tiny_bert, OmegaConf.create({"num_layers_fraction": fraction}))
    assert len(find_layer_stack(tiny_bert)[2]) == layers


@pytest.mark.parametrize(
    ("fraction", "width"), [(0.333, 512), (0.5, 768), (0.667, 1024), (0.1, 128), (0.01, 64)]
)
def test_an_ffn_fraction_keeps_that_share_of_the_width_in_steps_of_64(tiny_bert, fraction, width):
    # 1536 x fraction, to the nearest multiple of 64, at least 64.
    apply_edits(tiny_bert, OmegaConf.create({"ffn_width_fraction": fraction}))
    layer = find_layer_stack(tiny_bert)[2][0]
    assert layer.intermediate.dense.out_features == width


@pytest.mark.parametrize("value", [0, 1.5, -0.5, True, "half"])
def test_fractions_outside_0_1_are_refused_naming_the_key(tiny_bert, value):
    for key in ("ffn_width_fraction", "num_layers_fraction"):
        with pytest.raises(ConfigError, match=f"key 'model.{key}'.*must be a number in \\(0, 1\\]"):
            apply_edits(tiny_bert, OmegaConf.create({key: value}))


def test_the_whole_fraction_keeps_an_ffn_width_that_is_no_multiple_of_64():
    from dataclasses import replace

    from conftest import TINY_BERT

    model_cfg = {**TINY_BERT.model}
    model_cfg["config_overrides"] = {**model_cfg["config_overrides"], "intermediate_size": 1100}
    model = replace(TINY_BERT, model=model_cfg).build()
    # 1100 x 1.0 stays 1100 (1088 is the nearest multiple of 64, but 1100 itself is nearer);
    # 1100 x 0.5 = 550 -> 576, the nearest multiple of 64, halves up.
    for fraction, width in ((1.0, 1100), (0.99, 1100), (0.5, 576)):
        resolved = resolved_edits(model, OmegaConf.create({"ffn_width_fraction": fraction}))
        assert resolved == {"model.ffn_width": width}


def test_fraction_edits_name_their_own_key_on_a_model_without_the_structure():
    flat = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ConfigError, match="key 'model.ffn_width_fraction': the model has no"):
        apply_edits(flat, OmegaConf.create({"ffn_width_fraction": 0.5}))
    with pytest.raises(ConfigError, match="key 'model.num_layers_fraction': the model has no"):
        apply_edits(flat, OmegaConf.create({"num_layers_fraction": 0.5}))


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        # The unedited 2-layer tiny BERT, FFN 1536 wide, 2 heads: it records its own width,
        # depth and heads.
        ({}, {"model.ffn_width": 1536, "model.num_layers": 2, "model.num_heads": 2}),
        # Typed absolute values are what it deploys.
        (
            {"ffn_width": 1024, "num_layers": 1, "num_heads": 1},
            {"model.ffn_width": 1024, "model.num_layers": 1, "model.num_heads": 1},
        ),
        # Fractions: 1536 x 0.5 = 768 (a multiple of 64); 2 x 0.5 = 1 layer, 1 head.
        (
            {"ffn_width_fraction": 0.5, "num_layers_fraction": 0.5, "num_heads_fraction": 0.5},
            {"model.ffn_width": 768, "model.num_layers": 1, "model.num_heads": 1},
        ),
    ],
)
def test_the_architecture_names_the_width_and_depth_deployed(tiny_bert, edits, expected):
    from tuner.edits import architecture_of

    before = copy.deepcopy(tiny_bert.state_dict())
    assert architecture_of(tiny_bert, OmegaConf.create(edits)) == expected
    # Read off the unedited model, which it leaves as it was.
    assert all(torch.equal(before[k], v) for k, v in tiny_bert.state_dict().items())


def test_a_model_without_layers_or_ffns_has_no_architecture_to_name():
    from tuner.edits import architecture_of

    flat = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert architecture_of(flat, OmegaConf.create({})) == {}

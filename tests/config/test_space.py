from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from tuner.config.space import build_search_space, parse_expression
from tuner.errors import ConfigError


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("tag(log, interval(1e-6, 1e-4))", FloatDistribution(1e-6, 1e-4, log=True)),
        ("interval(0.1, 0.5)", FloatDistribution(0.1, 0.5)),
        ("interval(1, 5)", FloatDistribution(1.0, 5.0)),
        ("range(512, 1537, 256)", IntDistribution(512, 1536, step=256)),
        ("range(512, 1536, 256)", IntDistribution(512, 1280, step=256)),
        ("range(1, 4)", IntDistribution(1, 3)),
        ("tag(log, range(1, 9))", IntDistribution(1, 8, log=True)),
        ("range(0.0, 0.35, 0.1)", FloatDistribution(0.0, 0.3, step=0.1)),
        ("choice(0, 1.0, 5.0)", CategoricalDistribution((0, 1.0, 5.0))),
        ("choice(auto, xavier, kaiming)", CategoricalDistribution(("auto", "xavier", "kaiming"))),
        ("choice(true, false)", CategoricalDistribution((True, False))),
    ],
)
def test_expression_to_distribution(expression, expected):
    assert parse_expression("train.x", expression) == expected


@pytest.mark.parametrize(("expression", "fixed"), [("0.5", 0.5), ("adam", "adam"), (3, 3)])
def test_plain_value_is_fixed(expression, fixed):
    assert parse_expression("train.x", expression) == fixed


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("interval(1e-4, 1e-6)", "low 0.0001 > high 1e-06"),
        ("tag(log, interval(0, 1))", "a log scale needs low > 0"),
        ("choice()", "empty choice is not legal"),
        ("choice(1, 1)", "repeats a choice"),
        ("interval(1", "cannot parse 'interval(1'"),
        ("range(5, 1)", "is empty"),
        ("range(1, 5, -1)", "needs a positive step"),
        ("tag(log, range(2, 10, 2))", "needs a step of 1"),
        ("tag(log, choice(1, 2))", "applies to interval() and range() only"),
        ("tag(fast, interval(1, 2))", "unknown tag(s) ['fast']"),
        ("choice([1, 2], 3)", "is not a scalar"),
    ],
)
def test_bad_expression_names_file_and_key(expression, message):
    with pytest.raises(ConfigError) as error:
        parse_expression("train.lr", expression, "search_spaces/optimizer.yaml")
    text = str(error.value)
    assert "search_spaces/optimizer.yaml" in text
    assert "'train.lr'" in text
    assert message in text


CONFIG = OmegaConf.create(
    {"train": {"lr": 0.1, "epochs": 2, "init": "auto"}, "model": {"ffn_width": None}}
)


def test_build_space_splits_sampled_and_fixed():
    space = build_search_space(
        {"train.lr": "tag(log, interval(1e-5, 1e-3))", "train.init": "xavier"}, CONFIG
    )
    assert space.distributions == {"train.lr": FloatDistribution(1e-5, 1e-3, log=True)}
    assert space.fixed == {"train.init": "xavier"}


def test_interval_on_int_key_samples_ints():
    space = build_search_space({"train.epochs": "interval(1, 4)"}, CONFIG)
    assert space.distributions["train.epochs"] == IntDistribution(1, 4)


def test_float_interval_on_int_key_fails():
    with pytest.raises(ConfigError, match="'train.epochs'.*samples floats"):
        build_search_space({"train.epochs": "interval(1.5, 4)"}, CONFIG)


def test_unknown_key_names_its_file():
    with pytest.raises(ConfigError) as error:
        build_search_space(
            {"train.lrr": "interval(0.1, 0.2)"}, CONFIG, {"train.lrr": "search_spaces/x.yaml"}
        )
    assert "search_spaces/x.yaml" in str(error.value)
    assert "'train.lrr'" in str(error.value)
    assert "unknown key" in str(error.value)


def test_group_key_is_rejected():
    with pytest.raises(ConfigError, match="names a config group"):
        build_search_space({"train": "choice(1, 2)"}, CONFIG)


def test_pinned_keys_are_fixed_at_their_config_value():
    from tuner.config.compose import load_search_space

    cfg = OmegaConf.create(
        {
            "train": {"lr": 0.01, "init": "auto"},
            "search_space": {"train.lr": "interval(1e-5, 1e-3)", "train.init": "choice(auto)"},
        }
    )
    space = load_search_space(cfg, {}, pinned={"train.lr"})
    assert set(space.distributions) == {"train.init"}
    assert space.fixed == {"train.lr": 0.01}

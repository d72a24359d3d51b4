"""Every experiment and every search-space file composes, parses and passes the start-up checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tuner.config.compose import (
    CONF_DIR,
    SEARCH_SPACE_DIR,
    apply_debug,
    debug_profile_keys,
    register_resolvers,
    resolve,
    search_space_sources,
)
from tuner.config.space import build_search_space
from tuner.errors import ConfigError
from tuner.study.checks import check_config

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
SPACE_FILES = sorted(SEARCH_SPACE_DIR.glob("*.yaml"))


def _compose(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("debug", [None, "smoke"])
def test_experiment_composes_and_checks(experiment, debug):
    overrides = [f"+experiment={experiment}"] + ([f"debug={debug}"] if debug else [])
    cfg = resolve(apply_debug(_compose(*overrides)))
    sources = search_space_sources(experiment)
    space = build_search_space(cfg.search_space, cfg, sources)
    check_config(cfg, space, sources)
    assert cfg.study.name.startswith(experiment)
    assert space.distributions, "an experiment should search something"
    assert set(sources) == set(cfg.search_space)


@pytest.mark.parametrize("space_file", SPACE_FILES, ids=lambda p: p.stem)
def test_search_space_file_parses_against_every_experiment_with_its_keys(space_file: Path):
    space = OmegaConf.load(space_file)
    sources = {key: space_file.name for key in space}
    fitting = 0
    for experiment in EXPERIMENTS:
        cfg = resolve(_compose(f"+experiment={experiment}"))
        if not all(OmegaConf.select(cfg, key, default=KeyError) is not KeyError for key in space):
            continue
        parsed = build_search_space(space, cfg, sources)
        check_config(cfg, parsed, sources)
        assert set(parsed.keys) == set(space)
        fitting += 1
    assert fitting, f"{space_file.name} names keys no experiment has"


# The training knobs every task shares: one file each, composed by every experiment.
SHARED_SPACES = {
    "train.weight_decay": "search_spaces/regularization.yaml",
    "train.grad_clip_norm": "search_spaces/regularization.yaml",
    "train.init": "search_spaces/init.yaml",
    "train.mixup_alpha": "search_spaces/mixup.yaml",
}


@pytest.mark.parametrize("key", SHARED_SPACES)
def test_text_and_image_experiments_compose_the_same_search_space_files(key):
    shared = OmegaConf.load(CONF_DIR.parent / SHARED_SPACES[key])
    for experiment in ("bert_ffn", "resnet_mixup"):
        assert search_space_sources(experiment)[key] == SHARED_SPACES[key], experiment
        # What Hydra composed is that file's entry, not a copy set elsewhere.
        composed = _compose(f"+experiment={experiment}")
        assert composed.search_space[key] == shared[key], experiment
    # No other file (a per-task variant) defines the key.
    defining = [f.name for f in SPACE_FILES if key in OmegaConf.load(f)]
    assert defining == [Path(SHARED_SPACES[key]).name]


def test_debug_profile_wins_over_the_experiment_and_renames_the_study():
    plain = resolve(apply_debug(_compose("+experiment=bert_ffn")))
    smoke = resolve(apply_debug(_compose("+experiment=bert_ffn", "debug=smoke")))
    assert plain.study.n_trials == 6 and smoke.study.n_trials == 2
    assert smoke.study.name == "bert_ffn-smoke"
    assert smoke.model.random_init and smoke.model.config_overrides.num_hidden_layers == 6
    # Everything the profile does not name stays as the experiment set it.
    assert smoke.search_space == plain.search_space
    assert smoke.train.lr == plain.train.lr
    tuned = resolve(
        apply_debug(
            _compose("+experiment=bert_ffn", "debug=smoke", "debug.overrides.study.n_trials=3")
        )
    )
    assert tuned.study.n_trials == 3


def test_the_debug_profile_shrinks_each_model_family_its_own_way():
    text = resolve(apply_debug(_compose("+experiment=bert_ffn", "debug=smoke")))
    image = resolve(apply_debug(_compose("+experiment=resnet_mixup", "debug=smoke")))
    assert text.model.random_init and text.model.config_overrides.hidden_size == 32
    # The timm model gets none of the transformer's overrides, and stays searched as it was.
    assert "random_init" not in image.model and "config_overrides" not in image.model
    assert image.data.max_train_samples == 256 and image.study.name == "resnet_mixup-smoke"
    assert debug_profile_keys(_compose("+experiment=bert_ffn", "debug=smoke")) >= {
        "model.random_init",
        "model.config_overrides.hidden_size",
        "study.n_trials",
    }
    # debug.overrides.model.* wins over the family's tiny model.
    tuned = _compose(
        "+experiment=bert_ffn", "debug=smoke", "+debug.overrides.model.random_init=false"
    )
    assert not resolve(apply_debug(tuned)).model.random_init


def test_a_heartbeat_grace_period_within_one_interval_is_refused():
    cfg = resolve(_compose("+experiment=bert_ffn", "study.heartbeat.grace_period=10"))
    space = build_search_space(cfg.search_space, cfg, {})
    with pytest.raises(ConfigError, match="'study.heartbeat.grace_period': 10 must be longer"):
        check_config(cfg, space, {})


def test_an_unknown_latency_statistic_is_refused_naming_the_choices():
    cfg = resolve(_compose("+experiment=bert_ffn", "deploy.latency.statistic=mean"))
    space = build_search_space(cfg.search_space, cfg, {})
    with pytest.raises(
        ConfigError,
        match="key 'deploy.latency.statistic': unknown value 'mean'; choose one of min, p50",
    ):
        check_config(cfg, space, {})

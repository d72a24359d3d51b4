"""A study's settings are kept in the study: stored once, contradictions refused, deliberate
changes recorded."""

from __future__ import annotations

import optuna
import pytest

from tuner.config.compose import compose_config, resolve
from tuner.errors import ConfigError
from tuner.keys import CHANGES_ATTR, SETTINGS_ATTR
from tuner.store.settings import (
    check_change_keys,
    settings_of,
    settle,
    subtree,
    typed_contradiction,
)

SMOKE = ["+experiment=bert_ffn", "debug=smoke"]


def _settings(*overrides: str) -> dict:
    return settings_of(resolve(compose_config([*SMOKE, *overrides])))


def test_the_settings_name_every_value_that_shapes_results():
    settings = _settings("study.max_accuracy_drop=0.02")
    assert settings["study.max_accuracy_drop"] == 0.02
    assert settings["study.latency_budget_ms"] is None
    assert settings["study.hypervolume_reference.val_accuracy"] == 0.0
    assert settings["data.source"] == "rotten_tomatoes" and settings["data.split_seed"] == 0
    assert settings["deploy.latency.batch_size"] == 1
    assert settings["objectives"] == {"val_accuracy": "maximize", "latency_ms_p50": "minimize"}
    # Where the data is cached shapes nothing; nor which timed rounds count as steady (any run
    # may change it: the rounds it keeps measure the same latencies).
    assert "data.cache_dir" not in settings
    assert "deploy.latency.steady_within" not in settings
    assert "deploy.latency.steady_attempts" not in settings
    # The stored form rebuilds the data config.
    assert subtree(settings, "data")["split_seed"] == 0


def test_a_new_study_stores_them_and_a_contradiction_is_refused():
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    assert settle(study, _settings(), []) == []
    assert study.user_attrs[SETTINGS_ATTR] == _settings()
    with pytest.raises(ConfigError) as refused:
        settle(study, _settings("study.max_accuracy_drop=0.02"), [])
    message = str(refused.value)
    assert "key 'study.max_accuracy_drop'" in message
    assert "created with study.max_accuracy_drop=null" in message
    assert "this command gives study.max_accuracy_drop=0.02" in message
    assert "study.change_settings=[study.max_accuracy_drop]" in message
    # Nothing was changed by the refused command.
    assert study.user_attrs[SETTINGS_ATTR] == _settings()
    assert CHANGES_ATTR not in study.user_attrs


def test_a_deliberate_change_is_taken_and_recorded():
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    settle(study, _settings(), [])
    changed = settle(study, _settings("data.split_seed=3", "data.val_fraction=0.2"), ["data"])
    assert changed == ["data.split_seed", "data.val_fraction"]
    assert study.user_attrs[SETTINGS_ATTR]["data.split_seed"] == 3
    records = study.user_attrs[CHANGES_ATTR]
    assert [(r["key"], r["from"], r["to"]) for r in records] == [
        ("data.split_seed", 0, 3),
        ("data.val_fraction", 0.1, 0.2),
    ]
    assert all(r["after_trials"] == 0 and r["at"] for r in records)
    # Allowing one key does not allow another.
    with pytest.raises(ConfigError, match="key 'study.latency_budget_ms'"):
        settle(study, _settings("data.split_seed=3", "study.latency_budget_ms=5"), ["data"])


def test_the_objectives_cannot_be_changed():
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    settle(study, {**_settings(), "objectives": {"val_accuracy": "maximize"}}, [])
    with pytest.raises(ConfigError, match="key 'objectives'"):
        settle(study, _settings(), ["objectives"])


def test_the_latency_statistic_names_the_objective():
    assert _settings("deploy.latency.statistic=min")["objectives"] == {
        "val_accuracy": "maximize",
        "latency_ms_min": "minimize",
    }


def test_a_study_made_before_the_latency_statistic_was_a_setting_ranks_by_p50():
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    older = {k: v for k, v in _settings().items() if k != "deploy.latency.statistic"}
    study.set_user_attr(SETTINGS_ATTR, older)
    assert settle(study, _settings(), []) == []
    with pytest.raises(ConfigError) as refused:
        settle(study, _settings("deploy.latency.statistic=min"), [])
    message = str(refused.value)
    assert "key 'deploy.latency.statistic'" in message
    assert 'created with deploy.latency.statistic="p50"' in message
    # Not even on purpose: the points it has were ranked by p50, its objective.
    with pytest.raises(ConfigError) as on_purpose:
        settle(study, _settings("deploy.latency.statistic=min"), ["deploy.latency.statistic"])
    assert "key 'deploy.latency.statistic'" in str(on_purpose.value)
    assert "start another study.name" in str(on_purpose.value)
    assert study.user_attrs[SETTINGS_ATTR] == older


def test_a_study_that_keeps_no_settings_keeps_ranking_by_p50():
    # Made by a version that stored no settings: its points were ranked by p50.
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    study.add_trial(optuna.trial.create_trial(values=[0.8, 10.0]))
    with pytest.raises(ConfigError) as refused:
        settle(study, _settings("deploy.latency.statistic=min"), [])
    assert "key 'deploy.latency.statistic'" in str(refused.value)
    assert 'created with deploy.latency.statistic="p50"' in str(refused.value)
    assert SETTINGS_ATTR not in study.user_attrs
    assert settle(study, _settings(), []) == []
    assert study.user_attrs[SETTINGS_ATTR] == _settings()


def test_change_keys_must_be_settings():
    check_change_keys(["data", "data.split_seed", "study.hypervolume_reference", "deploy"])
    with pytest.raises(ConfigError, match="key 'study.change_settings': 'study.n_trials'"):
        check_change_keys(["study.n_trials"])
    # What the points were ranked by is no setting to change.
    for fixed in ("objectives", "deploy.latency.statistic"):
        with pytest.raises(ConfigError, match=f"'{fixed}': a study keeps the objectives"):
            check_change_keys([fixed])


def test_a_reading_command_refuses_only_what_it_typed():
    stored = _settings()
    given = _settings("data.split_seed=4", "data.val_fraction=0.3")
    # Not typed (a default of this command line): the study's value is used, no refusal.
    assert typed_contradiction("s", stored, given, {"study.name"}) is None
    problem = typed_contradiction("s", stored, given, {"data.split_seed"})
    assert "key 'data.split_seed'" in str(problem) and "=0" in str(problem)
    # A group override (`data=csv`) covers every key under it.
    assert "key 'data.split_seed'" in str(typed_contradiction("s", stored, given, {"data"}))

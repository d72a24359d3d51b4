"""Attention heads in a real study: searched through `search_spaces/heads_fraction.yaml`, the
heads each trained model kept recorded, every point on the backends typed as
`deploy.backends=[...]`, and a point with pruned heads retrained to the same accuracy."""

from __future__ import annotations

import json
import re
import shlex

import optuna
import pytest
from conftest import run_cli
from mlflow import MlflowClient

from tuner.front import study_points
from tuner.keys import (
    ARCHITECTURE_ATTR,
    KEPT_HEADS_ATTR,
    KEPT_HEADS_TAG,
    RETRAIN_TAG,
    RUN_ID_ATTR,
    TRAINED_IN_ATTR,
)

SMOKE = ("+experiment=bert_ffn", "debug=smoke")
HEADS = "+search_spaces@search_space=heads_fraction"
BACKENDS = "deploy.backends=[eager,onnxruntime_fused]"
# The smoke encoder's 2 heads: a fraction keeps this many (half up, at least 1).
HEADS_OF = {0.5: 1, 0.667: 1, 0.833: 2, 1.0: 2}
# The smoke encoder's 6 layers.
LAYERS_OF = {0.5: 3, 0.667: 4, 0.833: 5, 1.0: 6}


@pytest.mark.slow
def test_a_study_prunes_heads_records_them_and_retrains_a_pruned_point(tmp_path):
    result = run_cli(tmp_path, *SMOKE, HEADS, BACKENDS, "debug.overrides.study.n_trials=3")
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(
        study_name="bert_ffn-smoke", storage=f"sqlite:///{tmp_path}/optuna.db"
    )
    points = study_points(study)
    assert {p.backend for p in points} == {"eager", "onnxruntime_fused"}
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    trained = [
        t
        for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get(TRAINED_IN_ATTR, t.number) == t.number
    ]
    pruned = []
    for trial in trained:
        fraction = trial.params.get("model.num_heads_fraction")
        # The study's teacher is the unedited model, with its own 2 heads.
        heads = 2 if fraction is None else HEADS_OF[fraction]
        assert trial.user_attrs[ARCHITECTURE_ATTR]["model.num_heads"] == heads
        kept = trial.user_attrs.get(KEPT_HEADS_ATTR)
        if heads == 2:
            assert kept is None
            continue
        layers = trial.user_attrs[ARCHITECTURE_ATTR]["model.num_layers"]
        assert layers == LAYERS_OF[trial.params["model.num_layers_fraction"]]
        assert len(kept) == layers and all(len(layer) == 1 for layer in kept)
        assert all(layer[0] in (0, 1) for layer in kept)
        tags = client.get_run(trial.user_attrs[RUN_ID_ATTR]).data.tags
        assert json.loads(tags[KEPT_HEADS_TAG]) == kept
        pruned.append(trial)
    assert pruned, "no trained model of the study pruned a head"

    # A point of a model with pruned heads retrains to the same accuracy, keeping the same heads.
    trial = pruned[0]
    point = next(p for p in points if p.trained_in_trial == trial.number)
    command = shlex.split(client.get_run(point.mlflow_run_id).data.tags[RETRAIN_TAG])
    overrides = [o for o in command[3:] if not o.startswith(("study.storage=", "tracking.uri="))]
    assert not any(o.startswith("deploy.backends=") for o in overrides)
    retrain_dir = tmp_path / "retrain"
    retrain_dir.mkdir()
    again = run_cli(retrain_dir, *overrides)
    assert again.returncode == 0, again.stderr
    (retrained,) = [
        s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{retrain_dir}/optuna.db")
    ]
    retrained_study = optuna.load_study(
        study_name=retrained, storage=f"sqlite:///{retrain_dir}/optuna.db"
    )
    (done,) = retrained_study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert done.values[0] == pytest.approx(point.val_accuracy, abs=1e-9)
    assert done.user_attrs[KEPT_HEADS_ATTR] == trial.user_attrs[KEPT_HEADS_ATTR]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("deploy.backends=[eager,no_such_backend]",),
            "key 'deploy.backends': unknown ['no_such_backend']",
        ),
        (("deploy.backends=[eager,eager]",), "key 'deploy.backends': listed twice ['eager']"),
        (
            ("deploy.backends=[eager]", "deploy.backend=eager"),
            "keys deploy.backend and deploy.backends both name the backends",
        ),
        (("deploy.backends=eager",), "key 'deploy.backends': 'eager' must be a list"),
    ],
)
def test_a_backend_list_the_study_cannot_take_is_refused_before_anything_is_made(
    overrides, message
):
    from tuner.config import compose_config
    from tuner.errors import ConfigError
    from tuner.study.preparation import prepare
    from tuner.tracking import override_keys

    with pytest.raises(ConfigError, match=re.escape(message)):
        prepare(compose_config([*SMOKE, *overrides]), {}, override_keys(list(overrides)))


def test_a_listed_backend_this_machine_cannot_run_is_refused_naming_why():
    from tuner.config import compose_config
    from tuner.deploy import BACKENDS, unavailable_backends
    from tuner.errors import ConfigError
    from tuner.study.preparation import prepare

    left_out = unavailable_backends(BACKENDS.names())
    if not left_out:
        pytest.skip("this machine runs every backend")
    name, reason = next(iter(left_out.items()))
    overrides = [f"deploy.backends=[eager,{name}]"]
    with pytest.raises(ConfigError, match=re.escape(f"this machine cannot run {name}: {reason}")):
        prepare(compose_config([*SMOKE, *overrides]), {}, {"deploy.backends"})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("model.num_heads=3",), "key 'model.num_heads': 3 must be an int in [1, 2]"),
        (
            ("model.num_heads=1", "model.num_heads_fraction=0.5"),
            "keys model.num_heads and model.num_heads_fraction set one edit two ways",
        ),
    ],
)
def test_heads_the_model_cannot_keep_are_refused_at_start_up(tmp_path, overrides, message):
    result = run_cli(tmp_path, *SMOKE, *overrides)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "optuna.db").exists()

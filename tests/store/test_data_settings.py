"""After a recorded change of a `data.*` setting, points of the old split leave the front and the
report, and a test accuracy is reused only on the split it was measured on. Studies are built by
hand in an Optuna SQLite storage: the code under test only reads them."""

from __future__ import annotations

import hashlib
import json

import mlflow
import optuna
import pytest
from conftest import TWO_BACKENDS, run_cli

from tuner.config.compose import compose_config, resolve
from tuner.front.points import study_points
from tuner.keys import CHANGES_ATTR, SETTINGS_ATTR, TEST_SPLIT_TAG
from tuner.store.settings import settings_of

SMOKE = ["+experiment=bert_ffn", "debug=smoke"]
STUDY = "bert_ffn-smoke"
# What a trial records about the data settings it was made on (`tuner.store.data_settings`).
DATA_SETTINGS = "data_settings"


def _settings(*overrides: str) -> dict:
    return settings_of(resolve(compose_config([*SMOKE, *overrides])))


def _fingerprint(settings: dict) -> str:
    """The stored form of a point's data settings: the first 12 hex digits of the sha256 of its
    `data.*` settings as sorted JSON. Points keep it, so it is pinned here."""
    data = {key: value for key, value in settings.items() if key.startswith("data.")}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _change(key: str, before, after, after_trials: int) -> dict:
    """A change record as `study.change_settings` stores it."""
    at = "2025-01-01T00:00:00+00:00"
    return {"key": key, "from": before, "to": after, "at": at, "after_trials": after_trials}


def _point(study: optuna.Study, accuracy: float, latency_ms: float, **attrs) -> None:
    user_attrs = {"deploy.backend": "eager", "reference_accuracy": accuracy, **attrs}
    study.add_trial(optuna.trial.create_trial(values=[accuracy, latency_ms], user_attrs=user_attrs))


def _study(tmp_path, name: str = STUDY) -> optuna.Study:
    storage = f"sqlite:///{tmp_path}/optuna.db"
    return optuna.create_study(
        study_name=name, storage=storage, directions=["maximize", "minimize"]
    )


def _points_then_seed_change(tmp_path, *points: tuple[float, float]) -> optuna.Study:
    """A study with `points` (accuracy, latency) made on data.split_seed=0 before points
    recorded their data settings, then data.split_seed changed to 1."""
    study = _study(tmp_path)
    study.set_user_attr(SETTINGS_ATTR, _settings())
    for accuracy, latency in points:
        _point(study, accuracy, latency)
    study.set_user_attr(SETTINGS_ATTR, _settings("data.split_seed=1"))
    change = _change("data.split_seed", 0, 1, after_trials=len(points))
    study.set_user_attr(CHANGES_ATTR, [change])
    return study


@pytest.fixture
def split_changed(tmp_path) -> optuna.Study:
    """Trials 0 and 1 made on data.split_seed=0 before points recorded their data settings;
    then data.split_seed changed to 1; trial 2 made after the change without a record (an older
    version), trial 3 recording today's settings, trial 4 recording other ones (made by a
    worker still given the old seed). Trial 4 and trial 1 dominate trial 2 and trial 3."""
    study = _points_then_seed_change(tmp_path, (0.95, 10.0), (0.90, 5.0))
    _point(study, 0.85, 8.0)
    _point(study, 0.80, 4.0, **{DATA_SETTINGS: _fingerprint(_settings("data.split_seed=1"))})
    _point(study, 0.99, 1.0, **{DATA_SETTINGS: _fingerprint(_settings())})
    return study


def test_the_front_holds_only_points_of_the_current_split(split_changed):
    points = study_points(split_changed)
    # By hand: of trials 2 (0.85, 8 ms) and 3 (0.80, 4 ms) neither dominates the other; the
    # old split's 0 (0.95, 10 ms), 1 (0.90, 5 ms) and 4 (0.99, 1 ms) would have hidden both.
    assert [p.trial_number for p in points] == [2, 3]
    assert [p.trial_number for p in points if p.pareto] == [2, 3]


def test_the_points_left_out_are_counted_and_the_change_named(split_changed):
    from tuner.store.data_settings import current_split

    split = current_split(split_changed.get_trials(), split_changed.user_attrs)
    assert split.left_out == (0, 1, 4)
    assert split.changed_keys == ("data.split_seed",)
    assert "3 points left out" in split.note()
    assert "data.split_seed" in split.note()


def test_a_setting_changed_back_brings_its_first_points_back(tmp_path):
    # split_seed 0 -> 1 after trial 0, and back to 0 after trial 1: trials 0 and 2 share a split.
    study = _study(tmp_path)
    _point(study, 0.9, 5.0)
    _point(study, 0.8, 4.0)
    _point(study, 0.7, 3.0)
    study.set_user_attr(SETTINGS_ATTR, _settings())
    changes = [
        _change("data.split_seed", 0, 1, after_trials=1),
        _change("data.split_seed", 1, 0, after_trials=2),
    ]
    study.set_user_attr(CHANGES_ATTR, changes)
    assert [p.trial_number for p in study_points(study)] == [0, 2]


def test_a_change_of_no_data_setting_leaves_every_point_in(tmp_path):
    study = _study(tmp_path)
    _point(study, 0.9, 5.0)
    study.set_user_attr(SETTINGS_ATTR, _settings("study.max_accuracy_drop=0.02"))
    changes = [_change("study.max_accuracy_drop", None, 0.02, after_trials=1)]
    study.set_user_attr(CHANGES_ATTR, changes)
    _point(study, 0.8, 4.0)
    assert [p.trial_number for p in study_points(study)] == [0, 1]


def _report(tmp_path, capsys, *args: str) -> tuple[int, str, str]:
    from tuner.report import main

    status = main(
        [
            *SMOKE,
            f"study.storage=sqlite:///{tmp_path}/optuna.db",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            *args,
        ]
    )
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_the_report_refuses_when_every_point_was_trained_on_another_split(tmp_path, capsys):
    _points_then_seed_change(tmp_path, (0.9, 5.0), (0.8, 4.0))
    status, out, err = _report(tmp_path, capsys)
    assert status == 2, out
    assert "no point trained on its current data settings" in err
    assert "2 point(s) were trained before the recorded change of data.split_seed" in err
    assert "Evaluating" not in out


def test_the_report_recommends_among_the_current_split_and_says_what_it_left_out(
    split_changed, tmp_path, capsys
):
    status, out, _ = _report(tmp_path, capsys, "--skip-test")
    assert status == 0
    assert "3 points left out" in out and "data.split_seed" in out
    # The most accurate point of the current split, 2, is the baseline; within 1 point of it
    # the fastest is 2 itself (3 is 5 points below); the old split's 4 is never recommended.
    assert "Recommended: trial #2 " in out and "#4" not in out


class _Evaluated(Exception):
    """Raised where the report would read the test split to evaluate a point."""


def _split_read():
    raise _Evaluated


@pytest.fixture
def runs(tmp_path):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("s")

    def run(tags: dict[str, str]) -> str:
        run_id = client.create_run(experiment, tags=tags).info.run_id
        client.log_metric(run_id, "test_accuracy", 0.7)
        return run_id

    return client, run


def _logged_point(run_id: str):
    from tuner.front.points import Point

    return Point(0, "eager", 0.8, 1.0, 1.0, 1.0, 0, model_uri="runs:/x/model", mlflow_run_id=run_id)


def test_a_test_accuracy_is_reused_only_on_the_split_it_was_measured_on(runs):
    from tuner.study.held_out_accuracy import test_accuracy

    client, run = runs
    measured = _logged_point(run({TEST_SPLIT_TAG: "aaaaaaaaaaaa"}))
    assert test_accuracy(measured, _split_read, client, "aaaaaaaaaaaa", True) == 0.7
    with pytest.raises(_Evaluated):
        test_accuracy(measured, _split_read, client, "bbbbbbbbbbbb", True)
    # Measured before test accuracies recorded their split: only a study whose data settings
    # never changed had no other split to measure it on.
    untagged = _logged_point(run({}))
    assert test_accuracy(untagged, _split_read, client, "bbbbbbbbbbbb", False) == 0.7
    with pytest.raises(_Evaluated):
        test_accuracy(untagged, _split_read, client, "bbbbbbbbbbbb", True)


@pytest.mark.slow
def test_a_study_resumed_after_a_data_change_records_each_point_s_split(tmp_path):
    first = run_cli(tmp_path, *SMOKE, TWO_BACKENDS, "debug.overrides.study.n_trials=1")
    assert first.returncode == 0, first.stderr
    change = ("data.split_seed=1", "study.change_settings=[data.split_seed]")
    again = run_cli(tmp_path, *SMOKE, TWO_BACKENDS, *change, "debug.overrides.study.n_trials=2")
    assert again.returncode == 0, again.stderr
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path}/optuna.db")
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    before = [t for t in complete if t.user_attrs["trained_in_trial"] == 0]
    after = [t for t in complete if t.user_attrs["trained_in_trial"] != 0]
    assert before and after
    now = _fingerprint(study.user_attrs[SETTINGS_ATTR])
    assert {t.user_attrs[DATA_SETTINGS] for t in after} == {now}
    assert len({t.user_attrs[DATA_SETTINGS] for t in before} - {now}) == 1
    assert {p.trial_number for p in study_points(study)} == {t.number for t in after}
    assert f"{len(before)} point" in again.stdout and "left out" in again.stdout

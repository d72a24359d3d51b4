"""What a study records stays whole whenever a signal lands, and a resume sees the study's own
settings. Real `debug=smoke` studies run in this process, so that a real signal can be sent at
an exact moment: while Optuna creates a trial, or while a model's points are being written."""

from __future__ import annotations

import os
import signal
from collections import Counter

import optuna
import pytest
from conftest import runnable_backends

from tuner.config.compose import compose_config
from tuner.errors import ConfigError
from tuner.keys import CHANGES_ATTR, CONFIGURATION_ATTR, RETRY_HISTORY, TRAINED_IN_ATTR
from tuner.store import budget
from tuner.study.run import run_study
from tuner.study.samplers import SAMPLERS
from tuner.tracking.runs import Tracker

pytestmark = pytest.mark.slow

TrialState = optuna.trial.TrialState
# Trials are counted and numbered as the sampler makes them: no distillation teacher trains
# first (tests/trial/test_teacher.py covers it, tests/study/test_workers.py its interrupts).
# Two backends besides the trial's own, so that a signal can land between two of a
# configuration's further points; cheap ones, since each costs its conversion in every study.
SMOKE = (
    "+experiment=bert_ffn",
    "debug=smoke",
    "train.distill.alpha=0",
    "deploy.backends=[eager,onnxruntime,onnxruntime_fused]",
)
STUDY = "bert_ffn-smoke"
BACKENDS = runnable_backends(*SMOKE)
_interrupt_at: list[int] = []


class _InterruptsWhileCreatingATrial(optuna.samplers.RandomSampler):
    """Sends Ctrl-C to this process from inside `study.ask()` (Optuna calls `before_trial`
    once the new trial exists in the storage), for the trial numbered in `_interrupt_at`."""

    def before_trial(self, study, trial) -> None:
        if _interrupt_at and trial.number == _interrupt_at[0]:
            _interrupt_at.clear()
            os.kill(os.getpid(), signal.SIGINT)


SAMPLERS.register("test_interrupts_while_creating_a_trial")(
    lambda seed: _InterruptsWhileCreatingATrial(seed=seed)
)


@pytest.fixture
def study_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's artifacts go under the working directory
    return tmp_path


def _run(directory, *overrides: str):
    args = [
        *SMOKE,
        f"study.storage=sqlite:///{directory}/optuna.db",
        f"tracking.uri=sqlite:///{directory}/mlflow.db",
        *overrides,
    ]
    return run_study(compose_config(args), overrides=args)


def _study(directory) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{directory}/optuna.db")


def _points_per_configuration_and_backend(study: optuna.Study) -> Counter:
    return Counter(
        (t.user_attrs[CONFIGURATION_ATTR], t.user_attrs["deploy.backend"])
        for t in study.get_trials(states=(TrialState.COMPLETE,))
    )


def _signal_while_adding_points(monkeypatch, at_point: int, signals: int) -> None:
    """Send `signals` Ctrl-Cs when the `at_point`-th other backend's point starts being
    written (its epochs are copied to its MLflow run first)."""
    calls = []
    replay = Tracker.replay_epochs

    def replay_then_signal(self, run_id, epochs):
        calls.append(run_id)
        if len(calls) == at_point:
            for _ in range(signals):
                os.kill(os.getpid(), signal.SIGINT)
        return replay(self, run_id, epochs)

    monkeypatch.setattr(Tracker, "replay_epochs", replay_then_signal)


def test_an_interrupt_while_optuna_creates_a_trial_leaves_nothing_running(study_dir):
    _interrupt_at[:] = [len(BACKENDS)]  # the second configuration's trial
    with pytest.raises(KeyboardInterrupt):
        _run(study_dir, "study.sampler=test_interrupts_while_creating_a_trial")
    study = _study(study_dir)
    interrupted = study.trials[len(BACKENDS)]
    assert interrupted.state == TrialState.FAIL
    # Queued again, and nothing left RUNNING without a heartbeat: a resume is not refused as
    # "another worker is running", and the study reaches its two configurations.
    assert not study.get_trials(states=(TrialState.RUNNING,))
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 1
    _run(study_dir, "study.sampler=test_interrupts_while_creating_a_trial")
    study = _study(study_dir)
    assert budget.trained(study.trials) == 2
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 2 * len(BACKENDS)


def test_an_interrupt_while_points_are_written_waits_for_them(study_dir, monkeypatch):
    # At the first of the configuration's further points: the second is still to be written.
    _signal_while_adding_points(monkeypatch, at_point=1, signals=1)
    with pytest.raises(KeyboardInterrupt):
        _run(study_dir)
    study = _study(study_dir)
    # The first configuration completed with every backend's point, once; the second never
    # started.
    assert _points_per_configuration_and_backend(study) == {(0, b): 1 for b in BACKENDS}
    assert len(study.trials) == len(BACKENDS)

    # The resume sees the study's own settings: another constraint is refused, naming both
    # values, before anything is trained...
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="created with study.max_accuracy_drop=null"):
        _run(study_dir, "study.max_accuracy_drop=0.02")
    assert len(_study(study_dir).trials) == len(BACKENDS)
    # ...unless the change is asked for, which the study records.
    change = "study.change_settings=[study.max_accuracy_drop]"
    _run(study_dir, "study.max_accuracy_drop=0.02", change)
    study = _study(study_dir)
    assert [(c["key"], c["from"], c["to"]) for c in study.user_attrs[CHANGES_ATTR]] == [
        ("study.max_accuracy_drop", None, 0.02)
    ]
    assert budget.trained(study.trials) == 2


def test_a_second_interrupt_stops_at_once_and_the_retry_adds_only_missing_points(
    study_dir, monkeypatch
):
    _signal_while_adding_points(monkeypatch, at_point=2, signals=2)
    with pytest.raises(KeyboardInterrupt):
        _run(study_dir, "debug.overrides.study.n_trials=1")
    study = _study(study_dir)
    first = study.trials[0]
    assert first.state == TrialState.FAIL
    # The first other backend's point was written before the second Ctrl-C.
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 1
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 1

    monkeypatch.undo()
    _run(study_dir, "debug.overrides.study.n_trials=1")
    study = _study(study_dir)
    # One point per backend of configuration 0, the earlier attempt's included: nothing twice.
    assert _points_per_configuration_and_backend(study) == {(0, b): 1 for b in BACKENDS}
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))


def _queue(study: optuna.Study, params: dict, distributions: dict, history: list[int]) -> None:
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.WAITING,
            params=params,
            distributions=distributions,
            system_attrs={"failed_trial": history[0], RETRY_HISTORY: history},
        )
    )


def test_a_retry_queued_with_a_drawn_backend_keeps_it(study_dir):
    # As an earlier version queued retries: with the backend the failed trial had drawn.
    _run(study_dir, "debug.overrides.study.n_trials=1")
    study = _study(study_dir)
    first = study.trials[0]
    drawn = BACKENDS[-1]
    params = {**first.params, "deploy.backend": drawn}
    _queue(study, params, first.distributions, history=[99])
    _run(study_dir, "debug.overrides.study.n_trials=2")
    retry = next(t for t in _study(study_dir).trials if t.system_attrs.get("failed_trial") == 99)
    assert retry.state == TrialState.COMPLETE
    assert retry.params["deploy.backend"] == retry.user_attrs["deploy.backend"] == drawn


def test_a_retry_whose_points_are_all_written_is_pruned_without_training(study_dir):
    _run(study_dir, "debug.overrides.study.n_trials=1")
    study = _study(study_dir)
    first = study.trials[0]
    # Every backend of configuration 0 has a point (the trial's own included, as a copy here):
    # what a worker killed just before closing its trial leaves.
    own = first.params["deploy.backend"]
    study.add_trial(
        optuna.trial.create_trial(
            params=first.params,
            distributions=first.distributions,
            values=first.values,
            user_attrs={**first.user_attrs, TRAINED_IN_ATTR: 999, "deploy.backend": own},
        )
    )
    params = {k: v for k, v in first.params.items() if k != "deploy.backend"}
    distributions = {k: first.distributions[k] for k in params}
    _queue(study, params, distributions, history=[0])
    _run(study_dir, "debug.overrides.study.n_trials=2")
    study = _study(study_dir)
    retry = next(t for t in study.trials if t.system_attrs.get("failed_trial") == 0)
    assert retry.state == TrialState.PRUNED
    assert (
        "every backend already has a point of configuration #0" in retry.user_attrs["fail_reason"]
    )
    assert "reference_accuracy" not in retry.user_attrs  # nothing was trained

"""Latency before training, the latency budget and early stopping in real studies: a tiny
ResNet on digits, trained in this process, with a sampler that scripts the learning rate so that
the learning curves are known in advance (lr 1e-9 learns nothing; equal params train alike)."""

from __future__ import annotations

import statistics

import optuna
import pytest
import torch
from mlflow.tracking import MlflowClient

import tuner.study.finishing
from tuner.config.compose import compose_config, with_params
from tuner.data import load_splits
from tuner.deploy.backends import BACKENDS, Backend
from tuner.deploy.backends.support.torch_files import export_weights, load_weights
from tuner.edits import apply_edits
from tuner.front.points import failures_of, study_points
from tuner.keys import CURVE_ATTR, PRUNED_ATTR, PRUNED_TAG
from tuner.latency.steadiness import _REFERENCES, MachineReference
from tuner.models import build_model
from tuner.store.latency_table import LatencyTable
from tuner.study.preparation import modality_for, prepare
from tuner.study.run import run_study
from tuner.study.samplers import SAMPLERS
from tuner.tracking.retrain import override_keys
from tuner.training import batch_loss, initialise_new_layers, train

pytestmark = pytest.mark.slow

TrialState = optuna.trial.TrialState
STUDY = "resnet_mixup-smoke"
# One architecture and one backend; only the learning rate is searched.
FIXED = (
    "+experiment=resnet_mixup",
    "debug=smoke",
    "data=digits",
    "data.max_train_samples=1200",
    "data.max_val_samples=300",
    "train.weight_decay=0",
    "train.grad_clip_norm=0",
    "train.init=auto",
    # Every configuration comes from the scripted sampler: no distillation teacher trains first.
    "train.distill.alpha=0",
    "train.mixup_alpha=0",
    "train.cutmix_alpha=0",
    "model.width_multiplier=0.25",
    "model.depth=1",
    "deploy.backend=eager",
    "search_space={train.lr:'choice(0.003,1e-9)'}",
    "study.sampler=test_scripted_lr",
)
_script: list[float] = []


class _ScriptedLearningRate(optuna.samplers.RandomSampler):
    """Draws `train.lr` from `_script`, in order."""

    def sample_independent(self, study, trial, param_name, param_distribution):
        if param_name == "train.lr":
            return _script.pop(0)
        return super().sample_independent(study, trial, param_name, param_distribution)


SAMPLERS.register("test_scripted_lr")(lambda seed: _ScriptedLearningRate(seed=seed))


@pytest.fixture
def study_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's artifacts go under the working directory
    return tmp_path


def _run(directory, learning_rates, *overrides: str):
    _script[:] = learning_rates
    args = _args(directory, *overrides)
    run_study(compose_config(args), overrides=args)
    assert not _script, "every scripted learning rate was drawn"
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{directory}/optuna.db")
    return study, MlflowClient(f"sqlite:///{directory}/mlflow.db")


def _args(directory, *overrides: str) -> list[str]:
    return [
        *FIXED,
        f"study.storage=sqlite:///{directory}/optuna.db",
        f"tracking.uri=sqlite:///{directory}/mlflow.db",
        *overrides,
    ]


def _curve_trained_alone(args: list[str], lr: float) -> list[float]:
    """The validation curve of the configuration trained on its own, with nothing measured
    before it: built, seeded, edited and initialised as a study does, then trained."""
    prepared = prepare(compose_config(args), {}, override_keys(args))
    cfg = with_params(prepared.cfg, {"train.lr": lr})
    splits = load_splits(cfg.data)
    modality = modality_for(cfg, prepared.space, splits)
    seed = int(cfg.train.seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build_model(cfg.model, splits.num_labels)
    torch.manual_seed(seed)
    apply_edits(model, cfg.model)
    initialise_new_layers(model.new_layers(), str(cfg.train.init))
    result = train(
        model,
        modality.encode(splits.train.items, splits.train.labels),
        modality.encode(splits.val.items, splits.val.labels),
        cfg.train,
        batch_loss("image", cfg.train, splits.num_labels),
    )
    return [epoch.val_accuracy for epoch in result.epochs]


def _run_of(client: MlflowClient, trial: optuna.trial.FrozenTrial):
    return client.get_run(trial.user_attrs["mlflow_run_id"])


def test_without_a_budget_or_early_stopping_the_trained_artifacts_are_timed(study_dir, capsys):
    # The trials' own measurements are what is looked at: no session at the end of the run
    # (it would add one where a trial's found no steady rounds).
    study, _ = _run(study_dir, [0.003, 0.003], "deploy.latency.front_sessions=1")
    # Nothing needed the latencies before training, so nothing was converted for them.
    assert "latency before training" not in capsys.readouterr().out
    first, second = study.get_trials()
    assert first.state == second.state == TrialState.COMPLETE
    # The first trained model's artifact was timed for the protocol's 5 rounds, the second
    # model of the same architecture added one; both points show the table's one latency.
    table = LatencyTable.of_attrs(study.user_attrs)
    (rounds,) = table.rounds.values()
    assert len(rounds) == 5 + 1
    latencies = {p.latency_ms for p in study_points(study)}
    assert latencies == {table.result(first.user_attrs["latency_key"]).p50_ms}


def _untimeable(artifact, deploy):
    """Eager weights that serve validation batches but fail every batch-1 call after the one
    conversion makes: the backend deploys, then cannot be timed."""
    model = load_weights(artifact)
    calls = {"batch of one": 0}

    def logits_of(*inputs):
        if inputs[0].shape[0] == 1:
            calls["batch of one"] += 1
            if calls["batch of one"] > 1:
                raise RuntimeError("cannot be timed")
        return model(*inputs)

    return logits_of


def test_a_backend_that_cannot_be_timed_fails_its_point_alone(study_dir, monkeypatch):
    untimeable = Backend("test_untimeable", export_weights, _untimeable)
    monkeypatch.setitem(BACKENDS._entries, "test_untimeable", untimeable)
    _script[:] = [0.003]
    fixed = [a for a in _args(study_dir) if not a.startswith(("search_space=", "deploy.backend="))]
    args = [
        *fixed,
        "search_space={train.lr:'choice(0.003,1e-9)',"
        "deploy.backend:'choice(eager,test_untimeable)'}",
        "study.n_trials=1",
        # The trial's own measurement is what is looked at: no second session at the end.
        "deploy.latency.front_sessions=1",
    ]
    run_study(compose_config(args), overrides=args)
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_dir}/optuna.db")
    by_backend = {
        t.user_attrs.get("deploy.backend", t.params.get("deploy.backend")): t
        for t in study.get_trials()
    }
    eager, failed = by_backend["eager"], by_backend["test_untimeable"]
    assert eager.state == TrialState.COMPLETE
    assert failed.state == TrialState.FAIL
    assert "timing failed: RuntimeError: cannot be timed" in failed.user_attrs["fail_reason"]
    # Eager's rounds, interleaved with the failing backend's until it failed, then timed alone,
    # are in the table; the failing backend left nothing there.
    table = LatencyTable.of_attrs(study.user_attrs)
    assert [len(rounds) for rounds in table.rounds.values()] == [5]
    # (the table keeps milliseconds to 4 decimals)
    assert table.result(eager.user_attrs["latency_key"]).p50_ms == pytest.approx(
        eager.values[1], abs=1e-3
    )
    assert not _script, "one configuration, trained once"


def test_a_configuration_over_the_latency_budget_is_not_trained(study_dir):
    study, client = _run(study_dir, [0.003, 0.003], "study.latency_budget_ms=0.0001")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.PRUNED, TrialState.PRUNED]
    for trial in trials:
        assert (
            "over study.latency_budget_ms=0.0001 before training" in trial.user_attrs[PRUNED_ATTR]
        )
        assert CURVE_ATTR not in trial.user_attrs  # no epoch was trained
        run = _run_of(client, trial)
        assert run.info.status == "KILLED" and run.data.tags[PRUNED_TAG] == "true"
        assert "before training" in run.data.tags["failure_reason"]
        assert client.get_metric_history(run.info.run_id, "train_loss") == []
    # Pruned, not failed: nothing is retried or reported as a failure.
    assert failures_of(trials).trials == 0 and failures_of(trials).points == 0
    # The latency was measured once, before training, and is kept for the next trial.
    table = LatencyTable.of_attrs(study.user_attrs)
    assert [len(rounds) for rounds in table.rounds.values()] == [5]


def test_a_curve_that_cannot_reach_the_front_is_stopped_and_one_that_can_goes_on(study_dir):
    # Two equal trials set the front and the gain still to come; lr 1e-9 stays near chance;
    # the last repeats the first trial, so its curve is the one that made the front.
    # The trials' own rounds are counted below: no session at the end of the run.
    study, client = _run(
        study_dir,
        [0.003, 0.003, 1e-9, 0.003],
        "train.epochs=3",
        "study.n_trials=4",
        "study.pruning.enabled=true",
        "deploy.latency.front_sessions=1",
    )
    trials = study.get_trials()
    states = [t.state for t in trials]
    assert states == [TrialState.COMPLETE] * 2 + [TrialState.PRUNED, TrialState.COMPLETE]
    first, _, stopped, repeat = trials
    assert first.user_attrs[CURVE_ATTR][-1] > 0.5, "the scripted good trial learns"
    # Stopped at the first epoch it could be, with its partial curve kept.
    assert len(stopped.user_attrs[CURVE_ATTR]) == 1
    assert "no point can join the front" in stopped.user_attrs[PRUNED_ATTR]
    run = _run_of(client, stopped)
    assert (
        run.info.status == "KILLED" and "stopped after epoch 1" in run.data.tags["failure_reason"]
    )
    assert len(client.get_metric_history(run.info.run_id, "val_accuracy")) == 1
    # Measuring latencies before training left training as it was without them.
    alone = _curve_trained_alone(
        _args(study_dir, "train.epochs=3", "study.n_trials=4", "study.pruning.enabled=true"), 0.003
    )
    assert first.user_attrs[CURVE_ATTR] == alone
    # The repeat trained alike, could always reach the front, and ran to the end.
    assert repeat.user_attrs[CURVE_ATTR] == first.user_attrs[CURVE_ATTR]
    assert _run_of(client, repeat).info.status == "FINISHED"
    assert failures_of(trials).trials == 0

    # Every point of the one architecture has the table's one latency: 5 rounds before the
    # first trial trained, one more per deployed model (the stopped one deployed nothing).
    table = LatencyTable.of_attrs(study.user_attrs)
    (rounds,) = table.rounds.values()
    assert len(rounds) == 5 + 3
    latencies = {p.latency_ms for p in study_points(study)}
    assert latencies == {table.result(first.user_attrs["latency_key"]).p50_ms}

    # A resume reuses the table: nothing is measured before training, one round is added.
    study, _ = _run(
        study_dir,
        [0.003],
        "train.epochs=3",
        "study.n_trials=5",
        "study.pruning.enabled=true",
        "deploy.latency.front_sessions=1",
    )
    table = LatencyTable.of_attrs(study.user_attrs)
    (rounds,) = table.rounds.values()
    assert len(rounds) == 5 + 4
    assert study.get_trials()[-1].state == TrialState.COMPLETE


def _slow_spell(monkeypatch, ends_before_the_front_is_confirmed: bool) -> None:
    """The machine reference reads its floor (5 ms) twice, then a slow spell (9 ms) through
    every trial; the spell ends as the front's confirmation starts, or lasts through it."""
    spell = {"on": True}
    readings = iter([5.0, 5.0])
    reference = MachineReference()
    monkeypatch.setattr(
        reference, "_fastest_call_ms", lambda: next(readings, 9.0 if spell["on"] else 5.0)
    )
    monkeypatch.setattr("tuner.latency.protocol.reference_for", lambda num_threads: reference)
    confirm_front = tuner.study.finishing.confirm_front

    def spell_ends_first(*args, **kwargs):
        spell["on"] = not ends_before_the_front_is_confirmed
        return confirm_front(*args, **kwargs)

    monkeypatch.setattr("tuner.study.finishing.confirm_front", spell_ends_first)


def _study_through_a_spell(study_dir, monkeypatch, ends_before_the_front_is_confirmed: bool):
    """Two trials of one architecture through a slow spell (`_slow_spell`): the study, its
    MLflow client, and its one key's sessions in time order, read straight from its
    attributes: 5 rounds on the first trained model, 1 added by the second, then the
    confirmation's two sessions (front_sessions=2: the trials' found no steady rounds)."""
    _slow_spell(monkeypatch, ends_before_the_front_is_confirmed)
    # No wait for the spell to pass: it does not, or has already.
    study, client = _run(study_dir, [0.003, 0.003], "deploy.latency.steady_wait_s=0")
    found = [s for n, s in study.user_attrs.items() if n.startswith("latency:")]
    sessions = sorted(found, key=lambda s: s["at"])
    assert [len(s["rounds"]) for s in sessions] == [5, 1, 5, 5]
    return study, client, sessions


def test_a_slow_spell_through_the_trials_is_left_out_once_the_front_finds_steady_rounds(
    study_dir, monkeypatch, capsys
):
    study, client, sessions = _study_through_a_spell(study_dir, monkeypatch, True)
    assert [s["steady"] for s in sessions] == [False, False, True, True]
    # The front's latency is the steady sessions' alone: the median of their rounds' medians.
    medians = [statistics.median(r) for s in sessions[2:] for r in s["rounds"]]
    first, second = study.get_trials()
    table = LatencyTable.of_attrs(study.user_attrs)
    latency = table.result(first.user_attrs["latency_key"])
    assert latency.rounds == 10
    assert latency.p50_ms == pytest.approx(statistics.median(medians))
    assert {p.latency_ms for p in study_points(study)} == {latency.p50_ms}
    # Both points' runs show it.
    for trial in (first, second):
        logged = _run_of(client, trial).data.metrics
        assert logged["latency_ms_p50"] == pytest.approx(latency.p50_ms)
        assert logged["latency_rounds"] == 10
    out = capsys.readouterr().out
    assert "too few steady rounds" not in out
    assert "sessions have steady rounds" not in out


def test_a_spell_through_the_confirmation_too_is_timed_front_sessions_times_and_said(
    study_dir, monkeypatch, capsys
):
    study, _, sessions = _study_through_a_spell(study_dir, monkeypatch, False)
    # Timed twice by the confirmation, at most (front_sessions=2), and never steady: the
    # latency pools every session (the steadiest rounds of each).
    assert [s["steady"] for s in sessions] == [False] * 4
    medians = [statistics.median(r) for s in sessions for r in s["rounds"]]
    (point, _) = study_points(study)
    assert point.latency_ms == pytest.approx(statistics.median(medians))
    out = capsys.readouterr().out
    assert out.count("(too few steady rounds: the steadiest kept)") == 2
    assert "the machine reference read no steady stretch in 0 s" in out
    assert "0 of its 4 sessions have steady rounds; its latency pools all of them" in out


def test_a_study_run_judges_its_rounds_against_readings_of_its_own(study_dir, monkeypatch):
    # Earlier work in this process left a floor no reading here can come near (0.001 ms; the
    # reference takes milliseconds): judged against it, every round would be a slow spell.
    left_behind = MachineReference(_fastest=[0.001, 0.001])
    monkeypatch.setitem(_REFERENCES, 2, left_behind)
    # Within 1000x of the run's own floor, every reading is steady.
    study, _ = _run(
        study_dir,
        [0.003, 0.003],
        "deploy.latency.num_threads=2",
        "deploy.latency.steady_within=1000",
        "deploy.latency.front_sessions=1",
    )
    sessions = [s for n, s in study.user_attrs.items() if n.startswith("latency:")]
    assert len(sessions) == 2 and all(s["steady"] is True for s in sessions)
    assert left_behind._fastest == [0.001, 0.001]

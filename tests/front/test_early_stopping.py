"""Early stopping under two objectives, on hand-made studies whose bounds are worked out by
hand: curves, a front, and the optimistic point of a running trial."""

from __future__ import annotations

import optuna
import pytest

from tuner.front.constraints import Baseline, Constraints
from tuner.front.early_stopping import (
    NotWorthTraining,
    PruningSettings,
    backend_gains,
    gain_still_to_come,
    over_budget_reason,
    sampler_view,
    stop_reason,
)
from tuner.front.points import points_of
from tuner.latency.protocol import LatencyResult
from tuner.store.optuna_compat import FilteredSampler

COMPLETE = optuna.trial.TrialState.COMPLETE


def _trial(number, accuracy, latency, backend, eager, curve=None, trained_in=None):
    attrs = {"deploy.backend": backend, "reference_accuracy": eager}
    if curve is not None:
        attrs["val_accuracy_curve"] = curve
    if trained_in is not None:
        attrs["trained_in_trial"] = trained_in
    trial = optuna.trial.create_trial(state=COMPLETE, values=[accuracy, latency], user_attrs=attrs)
    trial.number = number
    return trial


# Two trained configurations of three epochs; the second also has an int8 point that beat its
# eager model by 0.01. The front: #0 (0.80, 10 ms) and #2 (0.73, 3 ms), which dominates #1.
TRIALS = [
    _trial(0, 0.80, 10.0, "eager", 0.80, curve=[0.50, 0.70, 0.80]),
    _trial(1, 0.72, 5.0, "eager", 0.72, curve=[0.60, 0.65, 0.72]),
    _trial(2, 0.73, 3.0, "int8", 0.72, trained_in=1),
]
ON = PruningSettings(enabled=True, min_epochs=1, margin=0.02, n_startup_trials=2)


def _reason(accuracy, epoch, latencies, settings=ON, constraints=None):
    constraints = constraints or Constraints()
    points = points_of(TRIALS, constraints)
    return stop_reason(accuracy, epoch, 3, latencies, TRIALS, points, constraints, settings)


def test_the_front_is_as_worked_out():
    assert [p.trial_number for p in points_of(TRIALS) if p.pareto] == [0, 2]


def test_gain_still_to_come_is_the_largest_of_complete_curves():
    # From epoch 1: 0.80 - 0.50 and 0.72 - 0.60; from epoch 2: 0.10 and 0.07.
    assert gain_still_to_come(TRIALS, 1, 3, 2) == pytest.approx(0.30)
    assert gain_still_to_come(TRIALS, 2, 3, 2) == pytest.approx(0.10)
    assert gain_still_to_come(TRIALS, 2, 3, 3) is None  # too few complete curves
    assert gain_still_to_come(TRIALS, 1, 4, 2) is None  # none trained four epochs


def test_backend_gains_are_points_over_their_eager_model():
    assert backend_gains(TRIALS) == pytest.approx({"eager": 0.0, "int8": 0.01})


def test_a_trial_none_of_whose_points_can_join_is_stopped():
    # Epoch 2 at 0.58: eager can reach 0.58 + 0.10 + 0.02 = 0.70 at 12 ms (#0 has 0.80 at 10);
    # int8 0.71 at 4 ms (#2 has 0.73 at 3).
    reason = _reason(0.58, 2, {"eager": 12.0, "int8": 4.0})
    assert reason is not None
    assert "dominated by trial #0" in reason and "dominated by trial #2" in reason
    assert "epoch 2 of 3" in reason


def test_a_trial_with_one_point_that_can_join_goes_on():
    # The same, but int8 at 2.5 ms would be the fastest point of all.
    assert _reason(0.58, 2, {"eager": 12.0, "int8": 2.5}) is None
    # Earlier, the larger gain still to come lets eager pass #0: 0.58 + 0.30 + 0.02 = 0.90.
    assert _reason(0.58, 1, {"eager": 12.0, "int8": 4.0}) is None


def test_infeasible_points_cannot_join():
    # Under an 11 ms budget eager's 0.70 at 12 ms is infeasible; int8's 0.71 at 4 ms is
    # feasible but dominated by #2 (0.73 at 3 ms), which the budget keeps on the front.
    constraints = Constraints(latency_budget_ms=11.0)
    reason = _reason(0.58, 2, {"eager": 12.0, "int8": 4.0}, constraints=constraints)
    assert reason is not None
    assert "eager (0.7000, 12.00 ms) infeasible" in reason
    assert "int8 (0.7100, 4.00 ms) dominated by trial #2" in reason
    # With accuracy points to spare, int8 at 2.5 ms is the fastest point: it goes on.
    assert _reason(0.58, 2, {"eager": 12.0, "int8": 2.5}, constraints=constraints) is None


def test_nothing_is_stopped_without_enough_knowledge_or_when_off():
    latencies = {"eager": 12.0, "int8": 4.0}
    assert _reason(0.58, 2, latencies, settings=PruningSettings()) is None  # off
    late_start = PruningSettings(enabled=True, min_epochs=3, margin=0.02, n_startup_trials=2)
    assert _reason(0.58, 2, latencies, settings=late_start) is None
    assert _reason(0.58, 2, {"eager": 12.0, "int8": None}) is None  # a latency unknown
    assert _reason(0.58, 3, latencies) is None  # the last epoch: nothing left to save


def test_over_budget_only_when_every_backend_is_known_and_over_in_its_fastest_round():
    slow = LatencyResult.of_rounds([[12.0], [13.0], [14.0]])
    fast = LatencyResult.of_rounds([[4.0], [5.0], [2.9]])  # median 4, fastest round 2.9
    reason = over_budget_reason({"a": slow, "b": fast}, 2.5, "p50")
    assert (
        "study.latency_budget_ms=2.5" in reason
        and "b 4.00 ms (fastest round 2.90, fastest call 2.90)" in reason
    )
    # One noisy measurement does not rule it out: its fastest round is within 3 ms.
    assert over_budget_reason({"a": slow, "b": fast}, 3.0, "p50") is None
    assert over_budget_reason({"a": slow, "b": None}, 2.5, "p50") is None
    assert over_budget_reason({"a": slow}, None, "p50") is None


def test_a_study_ranking_by_the_fastest_call_trains_what_its_fastest_call_fits():
    # Round medians 5 and 8 (fastest round 5), fastest call 2: over a 3 ms budget by p50, and
    # even in its fastest round, but within it by the fastest call, the study's latency.
    spiky = LatencyResult.of_rounds([[5.0, 2.0, 6.0], [7.0, 8.0, 9.0]])
    assert "study.latency_budget_ms=3" in over_budget_reason({"a": spiky}, 3.0, "p50")
    assert over_budget_reason({"a": spiky}, 3.0, "min") is None


def test_a_pruned_trial_is_shown_to_samplers_as_the_poor_point_it_stands_for():
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.add_trial(_trial(0, 0.80, 10.0, "eager", 0.80))
    pruned = NotWorthTraining("over budget", 0.0, 7.5)
    view = pruned.sampler_view(Constraints(latency_budget_ms=5.0), Baseline(0.80, 0))
    # Constraint values as Optuna reads them: 7.5 ms is 2.5 over the 5 ms budget.
    assert view == {"values": [0.0, 7.5], "constraints": {"latency_budget": 2.5}}
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED,
            user_attrs={"sampler_view": view, "pruned_reason": "over budget"},
        )
    )
    sampler = FilteredSampler(optuna.samplers.RandomSampler(), lambda t: True, sampler_view)
    seen = sampler._view(study).get_trials(states=(COMPLETE,))
    assert [(t.number, t.values) for t in seen] == [(0, [0.80, 10.0]), (1, [0.0, 7.5])]
    assert seen[1].constraints == {"latency_budget": 2.5}
    # The study itself keeps it pruned.
    assert study.trials[1].state == optuna.trial.TrialState.PRUNED


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("study.pruning.enabled=maybe", "'study.pruning.enabled': 'maybe' must be true or false"),
        ("study.pruning.min_epochs=0", "'study.pruning.min_epochs': 0 must be an int >= 1"),
        ("study.pruning.margin=-0.1", "'study.pruning.margin': -0.1 must be a number >= 0"),
        ("deploy.latency.rounds=0", "'deploy.latency.rounds': 0 must be an int >= 1"),
        ("deploy.latency.max_rounds=2", "'deploy.latency.max_rounds': 2 must be at least"),
        (
            "deploy.latency.front_sessions=0",
            "'deploy.latency.front_sessions': 0 must be an int >= 1",
        ),
        (
            "deploy.latency.steady_within=0",
            "'deploy.latency.steady_within': 0 must be a number > 0",
        ),
        (
            "deploy.latency.steady_within=fast",
            "'deploy.latency.steady_within': 'fast' must be a number > 0",
        ),
        (
            "deploy.latency.steady_attempts=0",
            "'deploy.latency.steady_attempts': 0 must be an int >= 1",
        ),
        (
            "deploy.latency.steady_wait_s=-1",
            "'deploy.latency.steady_wait_s': -1 must be a number >= 0",
        ),
    ],
)
def test_bad_pruning_and_round_settings_are_refused_at_start_up(override, named):
    from tuner.config.compose import compose_config
    from tuner.errors import ConfigError
    from tuner.study.preparation import prepare

    args = ["+experiment=bert_ffn", "debug=smoke", override]
    with pytest.raises(ConfigError) as refused:
        prepare(compose_config(args), {}, [override.split("=")[0]])
    assert named in str(refused.value)

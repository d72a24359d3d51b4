"""The recommendation rule on a fixed set of points."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.front.constraints import Baseline
from tuner.front.points import Point
from tuner.front.recommend import Rule, recommend


def _point(number: int, accuracy: float, latency: float, pareto: bool = True) -> Point:
    return Point(
        trial_number=number,
        backend="eager",
        val_accuracy=accuracy,
        latency_ms=latency,
        latency_ms_p95=latency,
        model_size_mb=1.0,
        trained_in_trial=number,
        pareto=pareto,
    )


FRONT = [
    _point(0, 0.800, 26.0),  # most accurate
    _point(1, 0.795, 14.0),  # within one point, faster
    _point(2, 0.790, 10.7),  # exactly one point below: still within
    _point(3, 0.770, 7.5),  # fastest, 3 points below
    _point(4, 0.799, 30.0, pareto=False),  # dominated: never recommended
]
# The study's best eager fp32 model is that of point 0.
BASELINE = Baseline(0.800, 0)


def test_default_is_the_fastest_point_within_one_accuracy_point():
    assert recommend(FRONT, Rule(), BASELINE).trial_number == 2


@pytest.mark.parametrize(
    ("drop", "expected"), [(0.0, 0), (0.005, 1), (0.02, 2), (0.05, 3), (None, 0)]
)
def test_accuracy_drop(drop, expected):
    assert recommend(FRONT, Rule(max_accuracy_drop=drop), BASELINE).trial_number == expected


@pytest.mark.parametrize(("budget", "expected"), [(8.0, 3), (12.0, 2), (20.0, 1), (100.0, 0)])
def test_latency_budget_alone_picks_the_most_accurate_that_fits(budget, expected):
    rule = Rule(max_accuracy_drop=None, max_latency_ms=budget)
    assert recommend(FRONT, rule, BASELINE).trial_number == expected


def test_both_limits_and_nothing_that_fits():
    both = Rule(max_accuracy_drop=0.01, max_latency_ms=12.0)
    assert recommend(FRONT, both, BASELINE).trial_number == 2
    assert recommend(FRONT, Rule(max_accuracy_drop=0.01, max_latency_ms=9.0), BASELINE) is None
    assert recommend(FRONT, Rule(max_accuracy_drop=None, max_latency_ms=5.0), BASELINE) is None
    assert recommend([], Rule(), BASELINE) is None


def test_a_point_exactly_at_the_drop_is_within_it():
    # 85 of 100 examples against 86: in floats 0.86 - 0.01 is above 0.85.
    front = [_point(0, 0.86, 20.0), _point(1, 0.85, 5.0)]
    assert recommend(front, Rule(max_accuracy_drop=0.01), Baseline(0.86, 0)).trial_number == 1
    assert recommend(front, Rule(max_accuracy_drop=0.009), Baseline(0.86, 0)).trial_number == 0


def test_ties_do_not_depend_on_order():
    twins = [_point(7, 0.79, 10.0), _point(5, 0.79, 10.0), _point(6, 0.80, 10.0)]
    assert recommend(twins, Rule(), BASELINE).trial_number == 6
    assert recommend(list(reversed(twins)), Rule(), BASELINE).trial_number == 6
    same = [_point(7, 0.79, 10.0), _point(5, 0.79, 10.0)]
    assert recommend(same, Rule(), BASELINE).trial_number == 5
    assert recommend([replace(p) for p in reversed(same)], Rule(), BASELINE).trial_number == 5


def test_the_drop_is_measured_from_the_study_baseline_not_the_front():
    # Only int8 points on the front; the best model reached 0.805 in eager fp32, so one point
    # below it is 0.795: point 2 (0.790) is out, although it is within one point of the front's
    # most accurate point (0.800).
    int8 = [replace(p, backend="int8_dynamic") for p in FRONT]
    assert recommend(int8, Rule(), Baseline(0.805, 9)).trial_number == 1
    # A study without a recorded baseline falls back to the front's most accurate point.
    assert recommend(int8, Rule(), Baseline()).trial_number == 2


def test_rule_descriptions():
    assert (
        Rule().describe()
        == "the fastest point within 1 accuracy point(s) of the best eager fp32 model"
    )
    assert (
        Rule(max_accuracy_drop=None, max_latency_ms=12).describe()
        == "the most accurate point with latency <= 12 ms"
    )

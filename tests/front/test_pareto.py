from __future__ import annotations

import pytest

from tuner.front.pareto import dominates, hypervolume, pareto_mask


def test_dominance():
    assert dominates((0.9, 10.0), (0.8, 12.0))
    assert dominates((0.9, 10.0), (0.9, 12.0))
    assert not dominates((0.9, 10.0), (0.9, 10.0))
    assert not dominates((0.9, 12.0), (0.8, 10.0))


def test_front_of_hand_made_points():
    points = [
        (0.80, 10.0),  # front: fastest
        (0.85, 15.0),  # front
        (0.84, 16.0),  # dominated by the one above
        (0.90, 30.0),  # front: most accurate
        (0.90, 31.0),  # dominated: same accuracy, slower
        (0.85, 15.0),  # duplicate of a front point: stays on the front
    ]
    assert pareto_mask(points) == [True, True, False, True, False, True]


def test_empty_and_single():
    assert pareto_mask([]) == []
    assert pareto_mask([(0.5, 1.0)]) == [True]


def test_hypervolume_of_hand_made_points():
    reference = (0.5, 40.0)
    # One point: a rectangle (40 - 10) ms x (0.8 - 0.5).
    assert hypervolume([(0.8, 10.0)], reference) == pytest.approx(30 * 0.3)
    # Two front points make a staircase: from 10 to 20 ms only the fast point counts (height
    # 0.3), from 20 ms on the more accurate one (height 0.4).
    assert hypervolume([(0.8, 10.0), (0.9, 20.0)], reference) == pytest.approx(10 * 0.3 + 20 * 0.4)


def test_hypervolume_ignores_dominated_duplicate_and_out_of_range_points():
    reference = (0.5, 40.0)
    front = [(0.8, 10.0), (0.9, 20.0)]
    # The two-step staircase alone: 10 x (0.8 - 0.5) + 20 x (0.9 - 0.5).
    expected = 10 * 0.3 + 20 * 0.4
    extra = [
        (0.85, 25.0),  # dominated by (0.9, 20)
        (0.8, 10.0),  # duplicate of a front point
        (0.8, 12.0),  # same accuracy, slower: dominated
        (0.4, 5.0),  # below the reference accuracy
        (0.95, 45.0),  # beyond the reference latency
        (0.5, 1.0),  # exactly at the reference accuracy: no height
    ]
    assert hypervolume(front, reference) == pytest.approx(expected)
    assert hypervolume(front + extra, reference) == pytest.approx(expected)
    assert hypervolume([], reference) == 0.0


def test_hypervolume_ties_in_latency_take_the_most_accurate():
    reference = (0.0, 10.0)
    assert hypervolume([(0.6, 5.0), (0.7, 5.0)], reference) == pytest.approx(5 * 0.7)


def test_hypervolume_only_grows_as_points_are_added():
    reference = (0.0, 100.0)
    points = [(0.7, 50.0), (0.6, 20.0), (0.65, 60.0), (0.8, 70.0), (0.75, 30.0)]
    history = [hypervolume(points[: n + 1], reference) for n in range(len(points))]
    assert history == sorted(history)
    assert history[-1] == pytest.approx(10 * 0.6 + 20 * 0.75 + 20 * 0.75 + 30 * 0.8)

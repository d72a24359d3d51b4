from __future__ import annotations

from tuner.pareto import dominates, pareto_mask


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

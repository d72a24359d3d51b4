"""The accuracy/latency Pareto front: maximise accuracy, minimise latency."""

from __future__ import annotations

from collections.abc import Sequence


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """`a` is at least as accurate and as fast as `b`, and strictly better in one."""
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


def pareto_mask(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (accuracy, latency) point, whether no other point dominates it.

    Identical points do not dominate each other, so duplicates on the front all stay on it.
    """
    return [not any(dominates(other, point) for other in points) for point in points]

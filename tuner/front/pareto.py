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


def hypervolume(points: Sequence[tuple[float, float]], reference: tuple[float, float]) -> float:
    """Area dominated by the (accuracy, latency) points and bounded by `reference`.

    The reference is (worst accuracy, worst latency) that still counts: points below its
    accuracy or above its latency add nothing. Units are accuracy x milliseconds; the value only
    grows as points are added, so its history shows how the search converged.
    """
    worst_accuracy, worst_latency = reference
    inside = sorted(
        (latency, accuracy)
        for accuracy, latency in points
        if accuracy > worst_accuracy and latency < worst_latency
    )
    area = 0.0
    best_accuracy = worst_accuracy
    for index, (latency, accuracy) in enumerate(inside):
        best_accuracy = max(best_accuracy, accuracy)
        next_latency = inside[index + 1][0] if index + 1 < len(inside) else worst_latency
        area += (next_latency - latency) * (best_accuracy - worst_accuracy)
    return area

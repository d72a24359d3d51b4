"""Two points side by side by where their time goes (the report's breakdown of the recommended
point against the most accurate eager one): their top op classes in ms and share, their
roofline fraction and layout-op count, and the one difference that matters most."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table

from tuner.front.points import Point
from tuner.insight import OP_CLASSES, MachinePeak
from tuner.latency import DEFAULT_STATISTIC

# The table's class rows: the union of each point's top this many classes, so every column
# shows the classes that matter for either point.
TOP_CLASSES = 3


def breakdown(points: Sequence[Point], peaks: Mapping[str, MachinePeak]) -> Table:
    """A column per point: its latency, its top op classes (ms, share of the profiled call), the
    profiled total, layout ops, GFLOP per call and the roofline fraction with its roof."""
    table = Table(title="Where one call's time goes (one profiled call, by op class)")
    table.add_column("")
    for p in points:
        table.add_column(f"#{p.trial_number} {p.backend}", justify="right")
    classes: list[str] = []
    for p in points:
        for name, _, _ in p.insight.top_classes(TOP_CLASSES) if p.insight else []:
            if name not in classes:
                classes.append(name)
    statistic = points[0].latency_statistic if points else DEFAULT_STATISTIC
    table.add_row(f"latency {statistic}", *(f"{p.latency_ms:.2f} ms" for p in points))
    for name in classes:
        table.add_row(name, *(_class_cell(p, name) for p in points))
    table.add_row(
        "profiled call",
        *(f"{p.insight.profiled_ms:.2f} ms" if _profiled(p) else "not profiled" for p in points),
    )
    table.add_row("layout ops", *(_layout_cell(p) for p in points))
    table.add_row(
        "GFLOP per call",
        *(f"{p.insight.flops / 1e9:.2f}" if p.insight and p.insight.flops else "-" for p in points),
    )
    table.add_row("roofline fraction", *(_roofline_cell(p, peaks) for p in points))
    return table


def _profiled(point: Point) -> bool:
    return point.insight is not None and point.insight.profiled


def _class_cell(point: Point, name: str) -> str:
    if not _profiled(point):
        return "-"
    assert point.insight is not None
    ms = point.insight.profile_ms.get(name, 0.0)
    return f"{ms:.2f} ms ({ms / point.insight.profiled_ms:.0%})"


def _layout_cell(point: Point) -> str:
    if point.insight is None or point.insight.layout_ops is None:
        return "-"
    return str(point.insight.layout_ops)


def _roofline_cell(point: Point, peaks: Mapping[str, MachinePeak]) -> str:
    line = (
        point.insight.roofline(point.latency_ms, point.model_size_mb, peaks)
        if point.insight
        else None
    )
    if line is None:
        return "-"
    assert point.insight is not None
    return line.describe(point.insight.precision)


def biggest_difference(chosen: Point, reference: Point) -> str | None:
    """One line naming the op class whose time differs most between the two profiled calls;
    None where either was not profiled."""
    if chosen.insight is None or reference.insight is None:
        return None
    mine, theirs = chosen.insight.profile_ms, reference.insight.profile_ms
    if not mine or not theirs:
        return None
    # In the classes' fixed order, so that a tie always names the same class.
    classes = [c for c in OP_CLASSES if c in mine or c in theirs]
    name = max(classes, key=lambda c: abs(mine.get(c, 0.0) - theirs.get(c, 0.0)))
    a, b = mine.get(name, 0.0), theirs.get(name, 0.0)
    change = (
        "the same"
        if round(a, 2) == round(b, 2)
        else f"{abs(a - b):.2f} ms " + ("less" if a < b else "more")
    )
    return (
        f"Biggest difference: {name}, {a:.2f} ms on #{chosen.trial_number} ({chosen.backend}) "
        f"against {b:.2f} ms on #{reference.trial_number} ({reference.backend}): "
        f"{change} per call."
    )

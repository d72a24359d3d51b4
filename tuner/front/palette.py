"""The colours every picture of a study draws with: matplotlib's `tab10`, spelled out so that
the plotly pages show the same colours as the PNGs."""

from __future__ import annotations

from collections.abc import Sequence

TAB10 = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


def colours_for(names: Sequence[str], order: Sequence[int] | None = None) -> dict[str, str]:
    """A colour per name: the palette's colours in `order` (positions in TAB10; the palette's
    own order by default), cycling when there are more names than colours."""
    picks = [TAB10[i] for i in (order if order is not None else range(len(TAB10)))]
    return {name: picks[i % len(picks)] for i, name in enumerate(names)}

"""The front's points side by side by where one call's time goes: a horizontal bar per point
(fastest at the top), split into its op classes' milliseconds, for the parent run
(`profile/by_backend.png`, and `profile/by_backend.html` whose hover gives each class's ms and
share, the point's layout ops and its latency)."""

from __future__ import annotations

from pathlib import Path

from tuner.front.palette import colours_for
from tuner.front.points import Point
from tuner.insight import OP_CLASSES, PointInsight

# One colour per op class, the same in every study's picture; the second class (attention) red.
_CLASS_COLOURS = colours_for(OP_CLASSES, order=(0, 3, 2, 1, 4, 5, 7, 6, 8))


def profiled_front(points: list[Point]) -> list[tuple[Point, PointInsight]]:
    """The front's points that carry a profile, fastest first, each with its insight."""
    front = [(p, p.insight) for p in points if p.pareto and p.insight and p.insight.profiled]
    return sorted(front, key=lambda pair: pair[0].latency_ms)


def _label(point: Point) -> str:
    return f"#{point.trial_number} {point.backend} ({point.latency_ms:.1f} ms)"


def plot_profile_png(points: list[Point], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Fastest at the top: matplotlib draws the first bar at the bottom.
    front = profiled_front(points)[::-1]
    figure, axes = plt.subplots(figsize=(10, 1.6 + 0.45 * len(front)), dpi=120)
    labels = [_label(p) for p, _ in front]
    left = [0.0] * len(front)
    for name in OP_CLASSES:
        widths = [insight.profile_ms.get(name, 0.0) for _, insight in front]
        if any(widths):
            axes.barh(labels, widths, left=left, color=_CLASS_COLOURS[name], label=name)
            left = [a + b for a, b in zip(left, widths, strict=True)]
    axes.set_xlabel("ms of one profiled call, by op class")
    axes.set_title(title)
    axes.grid(axis="x", alpha=0.3)
    # Beside the bars, never over them.
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, title="op class")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def plot_profile_html(points: list[Point], title: str, path: Path) -> None:
    """A self-contained page (plotly.js inlined): the MLflow UI shows it offline."""
    import plotly.graph_objects as go

    front = profiled_front(points)
    labels = [_label(p) for p, _ in front]
    figure = go.Figure()
    for name in OP_CLASSES:
        widths = [insight.profile_ms.get(name, 0.0) for _, insight in front]
        if not any(widths):
            continue
        hover = [
            f"{name}: {ms:.2f} ms ({ms / (insight.profiled_ms or 1):.0%})<br>"
            f"latency {p.latency_statistic} {p.latency_ms:.2f} ms, layout ops "
            f"{'-' if insight.layout_ops is None else insight.layout_ops}"
            for (p, insight), ms in zip(front, widths, strict=True)
        ]
        figure.add_trace(
            go.Bar(
                y=labels,
                x=widths,
                name=name,
                orientation="h",
                marker={"color": _CLASS_COLOURS[name]},
                hovertext=hover,
                hoverinfo="text",
            )
        )
    figure.update_layout(
        barmode="stack",
        title=title,
        xaxis_title="ms of one profiled call, by op class",
        yaxis={"autorange": "reversed"},
        template="plotly_white",
        legend_title="op class",
    )
    figure.write_html(path, include_plotlyjs=True, full_html=True)

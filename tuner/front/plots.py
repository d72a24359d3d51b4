"""Accuracy against latency, coloured by backend: the front solid and joined by its staircase,
dominated points faded, infeasible ones faded crosses. A static PNG and an interactive HTML page
(hover shows each point's trial, backend and params) tell the same story."""

from __future__ import annotations

from pathlib import Path

from tuner.front.palette import colours_for
from tuner.front.points import Point
from tuner.latency import DEFAULT_STATISTIC

# Per status: opacity, and marker names in matplotlib and plotly.
_OPACITY = {"pareto": 1.0, "dominated": 0.3, "infeasible": 0.3}
_MPL_MARKER = {"pareto": "o", "dominated": "o", "infeasible": "x"}
_PLOTLY_SYMBOL = {"pareto": "circle", "dominated": "circle", "infeasible": "x"}


def _colours(points: list[Point]) -> dict[str, str]:
    return colours_for(sorted({p.backend for p in points}))


def _latency_axis(points: list[Point]) -> str:
    statistic = points[0].latency_statistic if points else DEFAULT_STATISTIC
    return f"latency {statistic} (ms)"


def _front(points: list[Point]) -> list[Point]:
    return sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms)


def plot_front_png(points: list[Point], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5), dpi=120)
    colours = _colours(points)
    for backend, colour in colours.items():
        for status in _OPACITY:
            group = [p for p in points if p.backend == backend and p.status == status]
            if group:
                axes.scatter(
                    [p.latency_ms for p in group],
                    [p.val_accuracy for p in group],
                    color=colour,
                    alpha=_OPACITY[status],
                    marker=_MPL_MARKER[status],
                    s=55 if status == "pareto" else 35,
                    edgecolors="black" if status == "pareto" else None,
                    zorder=3,
                )
        axes.scatter([], [], color=colour, label=backend)
    front = _front(points)
    axes.step(
        [p.latency_ms for p in front],
        [p.val_accuracy for p in front],
        where="post",
        color="black",
        alpha=0.5,
        label="Pareto front",
    )
    for p in front:
        axes.annotate(f"#{p.trial_number}", (p.latency_ms, p.val_accuracy), fontsize=8)
    if any(not p.feasible for p in points):
        axes.scatter([], [], color="gray", marker="x", alpha=0.5, label="infeasible")
    axes.set_xlabel(_latency_axis(points))
    axes.set_ylabel("validation accuracy")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _hover(point: Point) -> str:
    lines = [
        f"trial {point.trial_number} ({point.status})",
        f"backend {point.backend}",
        f"val_accuracy {point.val_accuracy:.4f}",
        f"latency {point.latency_statistic} {point.latency_ms:.2f} ms, "
        f"p95 {point.latency_ms_p95:.2f} ms",
        f"size {point.model_size_mb:.1f} MB",
        *(f"{key} = {value}" for key, value in point.params.items() if key != "deploy.backend"),
    ]
    return "<br>".join(lines)


def plot_front_html(points: list[Point], title: str, path: Path) -> None:
    """A self-contained page (plotly.js inlined): the MLflow UI shows it offline."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for backend, colour in _colours(points).items():
        mine = [p for p in points if p.backend == backend]
        # The legend entry is a trace of its own, so it shows the colour at full strength
        # whatever the opacity of the backend's first point.
        figure.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=backend,
                legendgroup=backend,
                marker={"color": colour, "size": 10},
            )
        )
        figure.add_trace(
            go.Scatter(
                x=[p.latency_ms for p in mine],
                y=[p.val_accuracy for p in mine],
                mode="markers",
                name=backend,
                legendgroup=backend,
                showlegend=False,
                marker={
                    "color": colour,
                    "size": [12 if p.pareto else 9 for p in mine],
                    "opacity": [_OPACITY[p.status] for p in mine],
                    "symbol": [_PLOTLY_SYMBOL[p.status] for p in mine],
                    "line": {"width": [1.5 if p.pareto else 0 for p in mine], "color": "black"},
                },
                hovertext=[_hover(p) for p in mine],
                hoverinfo="text",
            )
        )
    front = _front(points)
    figure.add_trace(
        go.Scatter(
            x=[p.latency_ms for p in front],
            y=[p.val_accuracy for p in front],
            mode="lines",
            line={"shape": "hv", "color": "black", "width": 1},
            opacity=0.5,
            name="Pareto front",
            hoverinfo="skip",
        )
    )
    figure.update_layout(
        title=title,
        xaxis_title=_latency_axis(points),
        yaxis_title="validation accuracy",
        template="plotly_white",
        legend_title="backend",
    )
    figure.write_html(path, include_plotlyjs=True, full_html=True)

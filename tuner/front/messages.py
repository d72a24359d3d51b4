"""The front on the terminal: the table of points, and the recommendation."""

from __future__ import annotations

from rich.table import Table

from tuner.console import console, short
from tuner.front.constraints import Baseline, Constraints
from tuner.front.points import Failures, Point


def front_summary(
    study_name: str,
    points: list[Point],
    failures: Failures,
    baseline: Baseline,
    constraints: Constraints,
) -> None:
    if failures.points:
        console.print(
            f"[yellow]{failures.points} point(s) failed on their backend; see fail_reason.[/]"
        )
    if failures.trials:
        console.print(
            f"[yellow]{failures.trials} trial(s) failed before any point; see fail_reason.[/]"
        )
    front = sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms)
    if not front and points:
        measured_from = (
            f"; accuracy drops are measured from {baseline.describe()}"
            if constraints.max_accuracy_drop is not None
            else ""
        )
        console.print(
            f"[yellow]None of the {len(points)} point(s) of study '{study_name}' is within its "
            f"constraints ({constraints.describe()}{measured_from}): its front is empty.[/]"
        )
        return
    if not front:
        console.print(f"Study '{study_name}' has no complete trial yet.")
        return
    eager = eager_point_of(points, baseline)
    table = Table(title=f"Pareto front of '{study_name}' ({len(front)} of {len(points)} points)")
    latency = f"{front[0].latency_statistic} ms"
    columns = ["trial", "backend", "val_accuracy", latency, "p95 ms", "size MB"]
    columns.append(f"vs eager #{eager.trial_number}" if eager else "vs baseline")
    for column in columns:
        table.add_column(column, no_wrap=True)
    table.add_column("params", overflow="fold")
    for p in front:
        params = ", ".join(f"{key}={short(value)}" for key, value in p.params.items())
        accuracy = f"{100 * (p.val_accuracy - baseline.accuracy):+.2f} pts"
        row = [
            str(p.trial_number),
            p.backend,
            f"{p.val_accuracy:.4f}",
            f"{p.latency_ms:.2f}",
            f"{p.latency_ms_p95:.2f}",
            f"{p.model_size_mb:.1f}",
            f"{eager.latency_ms / p.latency_ms:.2f}x, {accuracy}" if eager else accuracy,
        ]
        table.add_row(*row, params)
    console.print(table)
    console.print(f"Accuracy differences and the constraints are against {baseline.describe()}.")
    if eager:
        console.print(
            f"Speed-ups are against that model's eager fp32 point "
            f"(#{eager.trial_number}: {eager.latency_ms:.2f} ms)."
        )


def recommendation(point: Point, rule: str) -> None:
    params = ", ".join(f"{key}={short(value)}" for key, value in point.params.items())
    console.print(
        f"[bold]Recommended: trial #{point.trial_number}[/] ({rule}): {point.backend}, "
        f"val_accuracy {point.val_accuracy:.4f}, "
        f"{point.latency_statistic} {point.latency_ms:.2f} ms (p95 {point.latency_ms_p95:.2f}), "
        f"{point.model_size_mb:.1f} MB\n  {params}"
    )


def eager_point_of(points: list[Point], baseline: Baseline) -> Point | None:
    """The eager fp32 point of the baseline's model, which speed-ups are read against; None
    where eager is not among the study's backends."""
    return next(
        (
            p
            for p in points
            if p.backend == "eager" and p.trained_in_trial == baseline.trained_in_trial
        ),
        None,
    )

"""What the terminal shows: trial headers, training progress with ETA, and the final front."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from tuner.constraints import Baseline, Constraints
from tuner.errors import TrialFailed
from tuner.front import Failures, Point
from tuner.secrets import mask_url, mask_urls_in

if TYPE_CHECKING:
    from tuner.deploy import BackendResult
    from tuner.latency import LatencyResult
    from tuner.retime import Confirmation

# Logs and pipes get a wide page, so the front table stays readable there too.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def quiet_libraries() -> None:
    """Silence reports users cannot act on: weight-loading tables, progress bars, migrations."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import optuna
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Records of optuna.* child loggers pass through the handlers, not the parent's filters.
    for handler in logging.getLogger("optuna").handlers:
        if not any(isinstance(f, _WithoutFailedTrialReports) for f in handler.filters):
            handler.addFilter(_WithoutFailedTrialReports())
    for name in ("mlflow", "alembic", "urllib3", "huggingface_hub", "filelock", "matplotlib"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Deprecations raised inside libraries, not by anything in the user's config.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def trial_header(index: int, total: int, trial_number: int, params: Mapping[str, Any]) -> None:
    described = ", ".join(f"{key}={_short(value)}" for key, value in params.items())
    console.print(f"[bold]Trial {index}/{total}[/] (#{trial_number}) {described}")


def backend_result(result: BackendResult) -> None:
    from tuner.backends import BACKENDS

    # One column for every registered backend name, so results line up.
    width = max(len(name) for name in BACKENDS.names())
    if result.error:
        console.print(f"  {result.backend:<{width}} [red]failed:[/] {result.error}")
        return
    assert result.latency is not None
    console.print(
        f"  {result.backend:<{width}} val_accuracy {result.val_accuracy:.4f} "
        f"(agrees {result.agreement:.1%})  latency p50 {result.latency.p50_ms:6.2f} ms "
        f"(p95 {result.latency.p95_ms:.2f}, {result.latency.rounds} rounds "
        f"±{result.latency.spread_pct:.0f}%)  size {result.model_size_mb:.1f} MB  "
        f"convert {result.convert_seconds:.1f} s"
    )
    if result.notes.get("attention_fused") is False:
        console.print(
            f"  [yellow]{result.backend}: attention did not fuse[/] (softmax nodes are left in "
            "its graph; tag deploy.attention_fused=false)"
        )


def latencies_before_training(
    results: Mapping[str, LatencyResult | None], measured: list[str], statistic: str
) -> None:
    """One line: this architecture's latency on each backend by the study's `statistic`, and
    which were measured now (on the untrained model) rather than taken from the study's latency
    table."""
    shown = []
    for backend, result in results.items():
        if result is None:
            shown.append(f"{backend} ?")
            continue
        source = "" if backend in measured else " (table)"
        shown.append(
            f"{backend} {result.ranked_ms(statistic):.2f} ms ±{result.spread_pct:.0f}%{source}"
        )
    console.print(f"  latency before training ({statistic}): " + ", ".join(shown))


def untimed_before_training(backend: str, reason: str) -> None:
    console.print(
        f"  [yellow]{backend} did not convert the untrained model ({reason}); it is timed "
        "after training[/]"
    )


def rounds_set_aside(set_aside: int, timed: int) -> None:
    console.print(
        f"  [dim]{set_aside} of {timed} timed rounds set aside: the machine reference read a "
        "slow spell around them (deploy.latency.steady_within)[/]"
    )


def interleaved_timing_failed(reason: str) -> None:
    console.print(
        f"  [yellow]timing the backends in turn failed ({reason}); each is timed on its own[/]"
    )


def confirming_front(keys: int, sessions: int) -> None:
    console.print(
        f"Confirming the front: {keys} latenc{'y' if keys == 1 else 'ies'} on it rest on fewer "
        f"than {sessions} measurement sessions of steady rounds "
        "(deploy.latency.front_sessions); timing "
        f"{'it' if keys == 1 else 'them'} again, interleaved"
    )


def confirmed(confirmations: Sequence[Confirmation], statistic: str) -> None:
    """One line per key timed again: its latency before, this session's, and the latency over
    the sessions that count."""
    for done in confirmations:
        before, session, after = (
            r.ranked_ms(statistic) for r in (done.before, done.session, done.after)
        )
        unsteady = " (too few steady rounds: the steadiest kept)" if done.steady is False else ""
        console.print(
            f"  {done.label:<32} {statistic} {before:.2f} ms, this session {session:.2f} ms "
            f"({100 * (session - before) / before:+.1f}%){unsteady} -> {after:.2f} ms "
            f"({done.after.rounds} rounds)"
        )


def waited_for_steady(waited_s: float | None, timeout_s: float) -> None:
    """Said only where the confirmation had to wait for a slow spell to pass."""
    if waited_s is None:
        console.print(
            f"  [yellow]the machine reference read no steady stretch in {timeout_s:.0f} s; "
            "timing again in the spell[/]"
        )
    elif waited_s >= 1.0:
        console.print(f"  [dim]waited {waited_s:.0f} s for a slow spell to pass[/]")


def short_of_steady_sessions(label: str, counted: int, sessions: int) -> None:
    """A front key the confirmation timed as often as it may, still short of sessions of steady
    rounds (`LatencyTable.counted_session_count`)."""
    pooled = "those" if counted else "all of them, the steadiest rounds of each"
    console.print(
        f"  [yellow]{label}: {counted} of its {sessions} sessions have steady rounds; its "
        f"latency pools {pooled}; run the study again later to confirm it[/]"
    )


def front_not_confirmed(reason: str) -> None:
    console.print(
        f"[yellow]The front's latencies could not be confirmed ({reason}); they stay as measured[/]"
    )


def not_confirmed(label: str, reason: str) -> None:
    console.print(f"  [yellow]{label} not timed again ({reason}); it keeps its latency[/]")


def trial_pruned(trial_number: int, reason: str) -> None:
    console.print(f"  [yellow]trial #{trial_number} pruned:[/] {reason}")


def trial_failed(trial_number: int, reason: str, error: BaseException) -> None:
    console.print(f"  [red]trial #{trial_number} failed:[/] {mask_urls_in(reason)}")
    if not isinstance(error, TrialFailed):
        # Unexpected: keep the traceback, which Optuna's own report of it would have shown.
        print(mask_urls_in("".join(traceback.format_exception(error))), file=sys.stderr)


def stale_trial(trial_number: int, reason: str) -> None:
    console.print(f"  [yellow]trial #{trial_number} failed: {reason}[/]")


def budget_reached(study_name: str, n_trials: int) -> None:
    console.print(
        f"Study '{study_name}' has its {n_trials} trained configurations (study.n_trials); "
        "raise study.n_trials to add more."
    )


def confirming_finished_front(study_name: str, n_trials: int) -> None:
    console.print(
        f"Study '{study_name}' has its {n_trials} trained configurations (study.n_trials); "
        "this run confirms its front, some of whose latencies rest on too few sessions "
        "(deploy.latency.front_sessions)"
    )


def waiting_for_workers(running: int) -> None:
    console.print(
        f"The study has its configurations; waiting for {running} trial(s) running in other "
        "workers (one whose worker dies is queued again and taken here)."
    )


def training_teacher(trial_number: int, reference: object) -> None:
    console.print(
        f"Training the distillation teacher (train.distill.teacher={reference}) in trial "
        f"#{trial_number}, before any student; it is stored with the study for every worker."
    )


def teacher_loaded(trained_in: int, location: str) -> None:
    console.print(
        f"Loading the distillation teacher that trial #{trained_in} trained and stored "
        f"({location}) instead of training another; this retry deploys the backends that have "
        "no point of it yet."
    )


def waiting_for_teacher(trial_number: int) -> None:
    console.print(
        f"Waiting for the distillation teacher, trained by another worker in trial "
        f"#{trial_number} (one whose worker dies is queued again and taken here)."
    )


def teacher_missing(location: str, reason: str) -> None:
    console.print(
        f"[yellow]Notice:[/] the study's stored teacher at {location} cannot be loaded "
        f"({reason}); it is trained again, once."
    )


def database_retry(operation: str, error: str, seconds: float) -> None:
    console.print(
        f"  [yellow]database unavailable during {operation} ({error}); retrying for up to "
        f"{seconds:.0f} s[/]"
    )


def unknown_cpu(notice: str) -> None:
    console.print(f"[yellow]Notice:[/] {notice}")


def backend_left_out(backend: str, reason: str) -> None:
    console.print(f"[yellow]Backend {backend} is left out on this machine:[/] {reason}")


def model_not_logged(backend: str, reason: str) -> None:
    console.print(f"  [yellow]{backend}: point kept, but its model was not logged:[/] {reason}")


class _WithoutFailedTrialReports(logging.Filter):
    """Drops Optuna's reports of failed trials; `trial_failed` has already told the user."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Trial ") and " failed with " in message)


class LogProgress:
    """Training progress as plain lines, for logs that are no terminal (CI, nohup, a cluster
    job): a line every tenth of the steps or every `every_seconds`, whichever comes first, and
    one at the end, each with the step, the epoch's mean loss so far, elapsed time and ETA."""

    def __init__(self, every_seconds: float = 30.0, fraction: float = 0.1) -> None:
        self.every_seconds = every_seconds
        self.fraction = fraction
        self.description = ""
        self.started = self.last = time.monotonic()
        self.next_step = 0

    def add_task(self, description: str, total: int | None = None, **fields: Any) -> int:
        self.description = description
        self.started = self.last = time.monotonic()
        return 0

    def update(self, task: int, completed: int, total: int, loss: float | None = None) -> None:
        if not total:
            return
        now = time.monotonic()
        due = completed >= self.next_step or now - self.last >= self.every_seconds
        if not (due or completed == total):
            return
        self.last = now
        self.next_step = completed + max(1, math.ceil(total * self.fraction))
        elapsed = now - self.started
        remaining = elapsed / completed * (total - completed) if completed else 0.0
        shown_loss = f", loss {loss:.4f}" if loss is not None else ""
        console.print(
            f"  {self.description} step {completed}/{total} ({completed / total:.0%})"
            f"{shown_loss}, elapsed {_clock(elapsed)}, ETA {_clock(remaining)}"
        )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


@contextmanager
def training_progress() -> Iterator[Progress | LogProgress]:
    if not console.is_terminal:
        yield LogProgress()
        return
    progress = Progress(
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        console=console,
        transient=True,
    )
    with progress:
        yield progress


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
        params = ", ".join(f"{key}={_short(value)}" for key, value in p.params.items())
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


def review_hint(
    tracking_uri: str, experiment_id: str, parent_run_id: str | None, objective: str
) -> None:
    """How to look at the study in the MLflow UI: the command, and the addresses of the
    experiment's runs (with the latency `objective`'s column to add) and of the run holding the
    front (the UI opens an experiment on its GenAI overview otherwise)."""
    # Logs are read by others: a password in the URI is not printed.
    tracking_uri = mask_url(tracking_uri)
    served = tracking_uri.startswith(("http://", "https://"))
    base = tracking_uri.rstrip("/") if served else "http://127.0.0.1:5000"
    runs = f"{base}/#/experiments/{experiment_id}/runs"
    if not served:
        console.print(f"Review it: mlflow ui --backend-store-uri {tracking_uri}")
    console.print(f"  runs (add val_accuracy, {objective} and the pareto tag as columns): {runs}")
    if parent_run_id:
        console.print(f"  the front (Artifacts, pareto/front.html): {runs}/{parent_run_id}")


def recommendation(point: Point, rule: str) -> None:
    params = ", ".join(f"{key}={_short(value)}" for key, value in point.params.items())
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

"""The terminal: one rich console, training progress with ETA, quiet libraries, and the
formatting every package's messages share. Imports nothing of tuner: each package says its
own messages (`tuner.<package>.messages`)."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Logs and pipes get a wide page, so the front table stays readable there too.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def quiet_libraries() -> None:
    """Silence reports users cannot act on: weight-loading tables, progress bars, migrations."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # Read by transformers when it is imported: importing it here only to quiet it would cost
    # a command refused at start-up half a second of its three.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    transformers = sys.modules.get("transformers")
    if transformers is not None:  # imported already, its settings read
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    import optuna

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


def short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


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

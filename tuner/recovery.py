"""A trial whose worker stopped: queue it again, and close what the worker left open in MLflow.

Two ways in: the heartbeat callback, run by whichever live worker notices a silent trial
(SIGKILL, a lost machine), and the interrupt path of the worker itself (Ctrl-C, SIGTERM). Either
way the trial stays FAIL, its MLflow runs say why, and a copy with the same params waits in the
study for the next worker (or the next run of the same command); `study.n_trials` counts the
copy instead.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
from optuna.trial import FrozenTrial

from tuner import console
from tuner.budget import RETRY_HISTORY, retry_template
from tuner.tracking import Tracker


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the running trial is failed and queued again."""


# Interrupts that arrived but may not have reached the main code (see `interruptible`).
_pending: list[KeyboardInterrupt] = []


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt and SIGTERM raises `Terminated`, as usual, and both are
    remembered: a signal handler can run inside a garbage-collection callback or `__del__`,
    where Python prints the exception and carries on, so `raise_if_interrupted` raises it
    again at the next safe point (every training step, every backend)."""

    def handler(exception: type[KeyboardInterrupt]):
        def interrupt(signum, frame) -> None:
            _pending.append(exception())
            raise _pending[-1]

        return interrupt

    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, handler(KeyboardInterrupt)),
        signal.SIGTERM: signal.signal(signal.SIGTERM, handler(Terminated)),
    }
    try:
        yield
    finally:
        for signum, restored in previous.items():
            signal.signal(signum, restored)
        _pending.clear()


def raise_if_interrupted() -> None:
    """Raise an interrupt whose handler fired where its exception was lost."""
    if _pending:
        raise _pending.pop()


def requeue(
    storage: optuna.storages.BaseStorage, study_id: int, trial: FrozenTrial, max_retry: int
) -> bool:
    """Queue a copy of `trial` with its params; False once it has been retried `max_retry`
    times (it then stays failed, and counts)."""
    if len(trial.system_attrs.get(RETRY_HISTORY, [])) >= max_retry:
        return False
    storage.create_new_trial(study_id, template_trial=retry_template(trial))
    return True


class StaleTrials:
    """Optuna's heartbeat-stale callback: runs in a live worker when another one went silent."""

    def __init__(self, tracker: Tracker, max_retry: int, grace_period: int) -> None:
        self.tracker = tracker
        self.max_retry = max_retry
        self.grace_period = grace_period

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        queued = requeue(study._storage, study._study_id, trial, self.max_retry)
        reason = f"its worker sent no heartbeat for {self.grace_period} s (killed or lost); " + (
            "queued again with the same params" if queued else "retries exhausted"
        )
        self.tracker.close_abandoned(study.study_name, trial.number, reason)
        console.stale_trial(trial.number, reason)

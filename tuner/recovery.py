"""A trial whose worker stopped: queue it again, and close what the worker left open in MLflow.

Two ways in: the heartbeat callback, run by whichever live worker notices a silent trial
(SIGKILL, a lost machine), and the interrupt path of the worker itself (Ctrl-C, SIGTERM). Either
way the trial stays FAIL, its MLflow runs say why, and a copy with the same params waits in the
study for the next worker (or the next run of the same command); `study.n_trials` counts the
copy instead.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
from optuna.trial import FrozenTrial

from tuner import console
from tuner.budget import (
    DUPLICATE_ATTR,
    RETRY_HISTORY,
    is_configuration,
    retried_numbers,
    retry_template,
)
from tuner.front import FAIL_REASON_ATTR
from tuner.lease import Leases
from tuner.optuna_compat import storage_of, study_id_of
from tuner.tracking import Tracker


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the running trial is failed and queued again."""


class _Signals:
    """Interrupts that arrived and were not raised yet, and whether one raises at once."""

    def __init__(self) -> None:
        self.pending: list[KeyboardInterrupt] = []
        self.immediate = True


_signals = _Signals()


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt and SIGTERM raises `Terminated`, as usual, and both are
    remembered: a signal handler can run inside a garbage-collection callback or `__del__`,
    where Python prints the exception and carries on, so `raise_if_interrupted` raises it
    again at the next safe point (every training step, every backend). Inside `deferred`, the
    first interrupt only waits for such a point."""

    def handler(exception: type[KeyboardInterrupt]):
        def interrupt(signum, frame) -> None:
            first = not _signals.pending
            _signals.pending.append(exception())
            if _signals.immediate or not first:
                raise _signals.pending[-1]
            console.console.print("Interrupted: stopping once the study's records are whole.")

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
        _signals.pending.clear()
        _signals.immediate = True


@contextmanager
def deferred() -> Iterator[None]:
    """A first interrupt here is raised at the next safe point after the block, not inside it:
    for what must not stop half-way (Optuna creating a trial, points being written). A second
    interrupt stops at once. Signals reach the main thread only: in another thread (the tests run
    workers as threads) this changes nothing, lest two threads' blocks restore each other's
    state."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before, _signals.immediate = _signals.immediate, False
    try:
        yield
    finally:
        _signals.immediate = before


@contextmanager
def immediate() -> Iterator[None]:
    """Interrupts raise at once here (training, deploying), starting with one that waited."""
    before, _signals.immediate = _signals.immediate, True
    try:
        raise_if_interrupted()
        yield
    finally:
        _signals.immediate = before


def raise_if_interrupted() -> None:
    """Raise an interrupt that arrived but was not raised (lost in a finaliser, or waiting
    for the end of a `deferred` block)."""
    if _signals.pending:
        raise _signals.pending.pop()


def requeue(
    leases: Leases,
    storage: optuna.storages.BaseStorage,
    study_id: int,
    trial: FrozenTrial,
    max_retry: int,
) -> bool:
    """Queue a copy of `trial` with its params, once however many workers ask; False once it
    has been retried `max_retry` times (it then stays failed, and counts)."""
    if len(trial.system_attrs.get(RETRY_HISTORY, [])) >= max_retry:
        return False
    # A teacher trial finished unrun by an earlier version of tuner is never run again.
    if DUPLICATE_ATTR in trial.system_attrs:
        return False
    with leases.hold("requeue"):
        if trial.number not in retried_numbers(storage.get_all_trials(study_id, deepcopy=False)):
            storage.create_new_trial(study_id, template_trial=retry_template(trial))
    return True


class StaleTrials:
    """Optuna's heartbeat-stale callback: runs in a live worker when another one went silent."""

    def __init__(self, leases: Leases, tracker: Tracker, max_retry: int, grace_period: int) -> None:
        self.leases = leases
        self.tracker = tracker
        self.max_retry = max_retry
        self.grace_period = grace_period

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        try:
            queued = requeue(
                self.leases, storage_of(study), study_id_of(study), trial, self.max_retry
            )
            outcome = "queued again with the same params" if queued else "retries exhausted"
        except Exception as exc:  # `requeue_orphans` queues it on a later look
            outcome = f"not queued yet ({type(exc).__name__}: {exc}); it is on a later look"
        reason = f"its worker sent no heartbeat for {self.grace_period} s (killed or lost); "
        reason += outcome
        self.tracker.close_abandoned(study.study_name, trial.number, reason)
        console.stale_trial(trial.number, reason)


def died(trial: FrozenTrial) -> bool:
    """Failed without a reason of tuner's own: its worker was found dead, or interrupted."""
    return trial.state == optuna.trial.TrialState.FAIL and FAIL_REASON_ATTR not in trial.user_attrs


def requeue_orphans(
    leases: Leases, storage: optuna.storages.BaseStorage, study_id: int, max_retry: int
) -> None:
    """Queue every configuration whose trial failed without a reason of tuner's own (its worker
    died or was interrupted) and has no retry: the worker that failed it died, or lost the
    database, before queueing it."""
    trials = storage.get_all_trials(study_id, deepcopy=False)
    retried = retried_numbers(trials)
    for trial in trials:
        if died(trial) and trial.number not in retried and is_configuration(trial):
            requeue(leases, storage, study_id, trial, max_retry)

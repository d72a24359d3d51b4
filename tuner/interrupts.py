"""Ctrl-C and SIGTERM: raised at once, or held until a block that must finish has finished.

A worker interrupted mid-trial fails its trial and queues it again (`tuner.study`); blocks
that write to the storage or MLflow are `deferred` so that an interrupt never leaves half a
record behind.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tuner import console


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

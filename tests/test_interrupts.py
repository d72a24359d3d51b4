"""Interrupts stay interrupts even when their handler fires where Python ignores exceptions."""

from __future__ import annotations

import os
import signal

import pytest

from tuner.interrupts import Terminated, deferred, immediate, interruptible, raise_if_interrupted


class _SignalsWhileFinalised:
    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        # The handler runs at the next check of the interpreter, still inside __del__, where
        # its exception is printed and dropped.
        for _ in range(10_000):
            pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    ("signum", "expected"), [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_an_interrupt_lost_in_a_finaliser_is_raised_at_the_next_safe_point(signum, expected):
    with interruptible():
        _SignalsWhileFinalised(signum)  # dropped at once
        with pytest.raises(expected):
            raise_if_interrupted()
        # Raised once: the next safe point goes on.
        raise_if_interrupted()


def test_handlers_are_restored_and_nothing_stays_pending():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with interruptible():
        assert signal.getsignal(signal.SIGTERM) is not before[0]
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):
                pass
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    raise_if_interrupted()  # a handled interrupt is not raised again outside


def _signal(signum: int = signal.SIGINT) -> None:
    os.kill(os.getpid(), signum)
    for _ in range(10_000):  # the handler runs at one of the interpreter's next checks
        pass


def test_a_first_interrupt_waits_for_a_deferred_block_and_a_second_does_not():
    with interruptible():
        finished = False
        with deferred():
            _signal()
            finished = True
        assert finished
        # It is raised at the next safe point after the block.
        with pytest.raises(KeyboardInterrupt):
            raise_if_interrupted()
        with deferred():
            _signal()
            with pytest.raises(Terminated):
                _signal(signal.SIGTERM)  # a second one stops at once
                pytest.fail("the second interrupt did not raise")


def test_an_interrupt_that_waited_raises_where_interrupts_are_immediate_again():
    with interruptible(), deferred():
        _signal(signal.SIGTERM)
        with pytest.raises(Terminated), immediate():
            pytest.fail("immediate() let a waiting interrupt through")


def test_a_deferred_block_in_another_thread_leaves_the_main_threads_interrupts_immediate():
    import threading

    entered, release = threading.Event(), threading.Event()

    def holds_a_deferred_block() -> None:
        with deferred():
            entered.set()
            release.wait(10)

    with interruptible():
        thread = threading.Thread(target=holds_a_deferred_block)
        thread.start()
        try:
            assert entered.wait(10)
            with pytest.raises(KeyboardInterrupt):
                _signal()
                pytest.fail("a thread's deferred block held the main thread's interrupt")
        finally:
            release.set()
            thread.join()

"""Interrupts stay interrupts even when their handler fires where Python ignores exceptions."""

from __future__ import annotations

import os
import signal

import pytest

from tuner.recovery import Terminated, interruptible, raise_if_interrupted


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

"""Time limits on the user code a worker runs after a cell: a block past its limit ends with a
TimeoutError, and the limit's signal never escapes as anything else, however it lands."""

from __future__ import annotations

import contextlib
import signal
import time

import pytest

from fabric.worker.deadline import limit


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _forever() -> None:
    with contextlib.suppress(BaseException):  # user code that swallows even the first tick
        _spin(60)
    _spin(60)


def test_an_endless_call_ends_with_a_timeout_even_one_that_swallows_the_first_tick() -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"limit of 0\.05 s"), limit(0.05):
        _forever()
    assert time.monotonic() - start < 5


def test_a_block_ending_as_its_limit_ticks_never_lets_the_signal_escape() -> None:
    # blocks that end about when their tick lands: some ticks are handled as the block ends, on
    # the way out of it, where only a TimeoutError (or nothing) may come out
    outcomes = {"ok": 0, "timeout": 0}
    for _ in range(1500):
        try:
            with limit(0.001):
                _spin(0.00099)
            outcomes["ok"] += 1
        except TimeoutError:
            outcomes["timeout"] += 1
    assert sum(outcomes.values()) == 1500


def test_the_sessions_own_alarm_goes_on_after_the_limit() -> None:
    rang: list[int] = []
    before = signal.signal(signal.SIGALRM, lambda signum, frame: rang.append(signum))
    outer = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, if it runs one
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with limit(5):
            _spin(0.01)
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # still counting down
        end = time.monotonic() + 10
        while not rang and time.monotonic() < end:
            _spin(0.01)
        assert rang == [signal.SIGALRM]
    finally:
        signal.signal(signal.SIGALRM, before)
        signal.setitimer(signal.ITIMER_REAL, *outer)

"""Time limits on the user code a worker runs for itself after a cell: pickling a value
(`__reduce__`, `__getstate__`) and describing it (`__repr__`).

A limit is a real-time timer whose signal raises `Overdue` in the main thread, where that code
runs, and again each `seconds` after while the block has not ended: a `BaseException`, so that
user code's `except Exception` does not swallow it, and raised again should it swallow even that.
The block's caller sees a `TimeoutError`. Code that blocks in C without returning to the
interpreter is beyond it: the server's interrupt, escalated to a kill, stops that.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from types import FrameType


class Overdue(BaseException):
    """The block ran past its time limit (raised inside it)."""


@contextlib.contextmanager
def limit(seconds: float) -> Iterator[None]:
    """Run the block for at most `seconds` (0: no limit), else TimeoutError."""
    if seconds <= 0:
        yield
        return
    armed = [True]  # a signal that lands as the block ends raises nothing

    def overdue(signum: int, frame: FrameType | None) -> None:
        if armed[0]:
            raise Overdue

    before = signal.signal(signal.SIGALRM, overdue)
    start = time.monotonic()
    delay, interval = signal.setitimer(signal.ITIMER_REAL, seconds, seconds)
    try:
        yield
    except Overdue:
        raise TimeoutError(f"it ran past its limit of {seconds:g} s") from None
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if delay:  # the session's own alarm (`signal.alarm` in a cell) goes on
            signal.setitimer(signal.ITIMER_REAL,
                             max(delay - (time.monotonic() - start), 1e-6), interval)

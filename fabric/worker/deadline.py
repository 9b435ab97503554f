"""Time limits on the user code a worker runs for itself after a cell: pickling a value
(`__reduce__`, `__getstate__`) and describing it (`__repr__`).

A limit is a real-time timer whose signal raises `Overdue` in the main thread, where that code
runs, and again each `seconds` after while the block has not ended: a `BaseException`, so that
user code's `except Exception` does not swallow it, and raised again should it swallow even that.
The block's caller sees a `TimeoutError`. Code that blocks in C without returning to the
interpreter is beyond it: the server's interrupt, escalated to a kill, stops that.

`Overdue` is raised only inside the code the block calls, never in the block's own frame or the
limit's entry and exit: a signal handled there (as the block ends, say) would raise it where
nothing turns it into the `TimeoutError`, and it would end the worker. A block must therefore
call the code it limits, as every caller does; a tick that lands outside it waits for the next.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType, TracebackType


class Overdue(BaseException):
    """The block ran past its time limit (raised inside it)."""


class limit:
    """Run the block for at most `seconds` (0: no limit), else TimeoutError."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._block: FrameType | None = None

    def __enter__(self) -> None:
        if self.seconds <= 0:
            return
        self._block = sys._getframe(1)  # the frame the `with` is in
        self._before = signal.signal(signal.SIGALRM, self._overdue)
        self._start = time.monotonic()
        self._delay, self._interval = signal.setitimer(
            signal.ITIMER_REAL, self.seconds, self.seconds)

    def _overdue(self, signum: int, frame: FrameType | None) -> None:
        if self._block is not None and frame is not None and frame is not self._block \
                and frame.f_code not in _OWN:
            raise Overdue

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._block is None:
            return
        self._block = None  # a tick handled from here on raises nothing
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._before)
        if self._delay:  # the session's own alarm (`signal.alarm` in a cell) goes on
            signal.setitimer(signal.ITIMER_REAL,
                             max(self._delay - (time.monotonic() - self._start), 1e-6),
                             self._interval)
        if kind is Overdue:
            raise TimeoutError(f"it ran past its limit of {self.seconds:g} s") from None


_OWN = {limit.__enter__.__code__, limit.__exit__.__code__}

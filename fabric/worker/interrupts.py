"""The server's interrupt (SIGINT) in a worker: a KeyboardInterrupt while a cell's code or its
save runs (`during`), nothing otherwise.

One handler stays installed and reads a flag; the worker never switches SIGINT's handler
around a cell. Switching races with the signal: one taken just before the switch to the
raising handler is ignored, so an interrupt sent as soon as the server hears `started` could
be lost; and `signal.signal` first runs the handler of a signal already taken, so the switch
back could raise where nothing catches it, ending the worker. A flag is set and cleared
without any point where Python runs a signal's handler in between, so an interrupt raises
inside `during`'s `try` or not at all.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

T = TypeVar("T")


class Interrupts:
    def __init__(self) -> None:
        self.armed = False

    def during(self, work: Callable[[], T]) -> T | KeyboardInterrupt:
        """`work()`'s result, or the KeyboardInterrupt an interrupt raised in it (also one
        taken as it returned); its other exceptions pass."""
        try:
            self._install()
            self.armed = True
            return work()
        except KeyboardInterrupt as interrupt:
            return interrupt
        finally:
            self.armed = False
            self._install()  # until the next cell too, where this one put a handler of its own

    def _install(self) -> None:
        if signal.getsignal(signal.SIGINT) != self._take:
            signal.signal(signal.SIGINT, self._take)

    def _take(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            raise KeyboardInterrupt

"""Tasks that outlive the call that starts them (a build others wait for, a worker's close, a
watch), each with one owner: the owner keeps them referenced while they run, a failure nobody
awaits is logged rather than lost, and closing the owner cancels those still running and waits
for them to end. Work that ends within one call runs in an `asyncio.TaskGroup` instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """`awaitable`'s result, or TimeoutError after `seconds` (None: no limit). Not
    `asyncio.wait_for`: on Python 3.11 a cancel that comes as the awaitable completes is dropped
    there (the result is returned instead), and a loop around it then never ends: a stopping
    server waited on its upkeep's loop until it was killed."""
    async with asyncio.timeout(seconds):
        return await awaitable


class Background:
    """The tasks one object runs beside its callers; `close` ends them."""

    def __init__(self, owner: str) -> None:
        self.owner = owner  # whose they are, for the log
        self._tasks: set[asyncio.Task] = set()

    def start(self, coro: Coroutine[Any, Any, T], doing: str | None = None) -> asyncio.Task[T]:
        """Run `coro`: `doing` says what it does, for the log if it fails; None when a caller
        awaits its result (and so hears of its failure)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def ended(task: asyncio.Task) -> None:
            self._tasks.discard(task)
            if doing is not None and not task.cancelled() \
                    and (exc := task.exception()) is not None:
                log.warning("%s: %s failed: %s", self.owner, doing, exc, exc_info=exc)

        task.add_done_callback(ended)
        return task

    def __len__(self) -> int:
        """How many still run."""
        return len(self._tasks)

    def cancel(self) -> None:
        """Ask every task still running to stop (where the owner cannot wait: see `close`)."""
        for task in self._tasks:
            task.cancel()

    async def close(self) -> None:
        """Cancel the tasks still running and wait until each has ended."""
        while self._tasks:  # one may start another as it is cancelled
            tasks = list(self._tasks)
            self.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

"""Where a running server is: SIGUSR1 writes every thread's stack to the log at once (from the
signal handler, even if the loop is blocked), then every task's from the loop (what an idle loop
waits for, as when a stop never ends)."""

from __future__ import annotations

import asyncio
import faulthandler
import io
import logging
import signal

log = logging.getLogger(__name__)
DUMPED = "every task's stack is above"  # the dump's last line


def on_sigusr1(loop: asyncio.AbstractEventLoop) -> None:
    """Dump stacks on SIGUSR1 for as long as `loop` runs."""
    loop.add_signal_handler(signal.SIGUSR1, _log_tasks)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)  # then the loop's


def _log_tasks() -> None:
    tasks = asyncio.all_tasks()
    for task in tasks:
        out = io.StringIO()
        task.print_stack(file=out)
        log.warning("task %s:\n%s", task.get_name(), out.getvalue())
    log.warning("%s (%d tasks)", DUMPED, len(tasks))

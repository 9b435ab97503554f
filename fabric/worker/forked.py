"""A process a cell forks (`os.fork`, DataLoader and pool workers) is the cell's, never a
second worker.

The child is a copy of the worker with one thread: the worker's wire (a ZeroMQ socket, whose
context is not fork-safe), its stream flusher and fd readers stay with the parent, and a lock
another thread held at the fork stays held. So in the child the worker's streams write straight
to fds 1 and 2, which are the parent's capture pipes (they show in the cell's output, as a
child's of a plain kernel's cell), never waiting on readers it does not have; rich outputs
reach the cell as their text; nothing goes on the wire; the worker's wake signal is unblocked,
as in any process; and when the cell's code ends in it, it exits (`leave_if_child`) instead of
going on to save and answer the server as the worker.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import wake

if TYPE_CHECKING:
    from .shell import OutStream, ZMQInteractiveShell

_worker: int | None = None  # the worker's pid


def watch(streams: Sequence[OutStream], shell: ZMQInteractiveShell) -> None:
    """Called once in the worker, before any cell: how its forked children set themselves up."""
    global _worker
    _worker = os.getpid()

    def in_the_child() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {wake.WAKE})
        for stream, fd in zip(streams, (1, 2), strict=True):
            stream.write_to(fd)
        shell.sink = _as_text

    os.register_at_fork(after_in_child=in_the_child)


def in_child() -> bool:
    """Whether this is a child a cell forked, not the worker."""
    return _worker is not None and os.getpid() != _worker


def leave_if_child(failed: bool) -> None:
    """End a forked child whose cell's code is over, with status 1 if it `failed`."""
    if in_child():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failed else 0)


def _as_text(kind: str, **fields: Any) -> None:
    """An output shown as text on stdout (an error's traceback on stderr)."""
    if kind == "error":
        print(*fields["traceback"], sep="\n", file=sys.stderr)
    elif text := fields.get("data", {}).get("text/plain"):
        print(text)

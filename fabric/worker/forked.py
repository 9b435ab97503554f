"""A process a cell forks (`os.fork`) is the cell's, never a second worker.

The child is a copy of the worker with one thread: the worker's wire (a ZeroMQ socket, whose
context is not fork-safe), its stream flusher and fd readers stay with the parent, and a lock
another thread held at the fork stays held. So the child writes its `print`s straight to fds
1 and 2, which are the parent's capture pipes (they show in the cell's output, as a child's of
a plain kernel's cell); what would go on the wire (a `display` in it) is dropped, as a forked
kernel's is; and when the cell's code ends in it, it exits (`leave_if_child`) instead of going
on to save and answer the server as the worker.
"""

from __future__ import annotations

import os
import sys

_worker: int | None = None  # the worker's pid


def watch() -> None:
    """Called once in the worker, before any cell."""
    global _worker
    _worker = os.getpid()
    os.register_at_fork(after_in_child=_in_child)


def _in_child() -> None:
    if os.getpid() == _worker:
        return
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def in_child() -> bool:
    """Whether this is a child a cell forked, not the worker."""
    return _worker is not None and os.getpid() != _worker


def leave_if_child(failed: bool) -> None:
    """End a forked child whose cell's code is over, with status 1 if it `failed`."""
    if in_child():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failed else 0)

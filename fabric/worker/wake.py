"""Sleeping through a CRIU dump and waking after a restore, as the worker and server agree.

A process that is about to be dumped closes every socket to the outside, then waits for `WAKE`.
A restored copy (a template's, or a cooled session's worker) cannot be told anything before it
reconnects, since every copy holds the same memory; what does differ is its PID namespace or
its pid in it, so the copy connects to the endpoint named after both (`name`: the same seen
from inside, where /proc may be the namespace's own, and from the server), which the server
binds before sending `WAKE`.

`WAKE` stays blocked in every thread of a worker (threads inherit the mask), so it is only ever
taken by `sigwait`: it can arrive before the sleeper waits and is not lost, and it never
reaches user code.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import platform
import signal
import threading
import time
from pathlib import Path

WAKE = signal.SIGUSR1
PARENT_EVERY = 1.0  # seconds between a restored process's looks at its parent
_PR_SET_PDEATHSIG = 1
_RT_SIGTIMEDWAIT = {"x86_64": "128", "aarch64": "137"}  # where /proc/PID/wchan shows nothing


def restored_socket(socket_dir: Path, name: str) -> Path:
    """Where the server waits for the restored worker of this `name`."""
    return socket_dir / f"r{name}.sock"


def name() -> str:
    """This process's name that no other shares: its PID namespace's inode, its pid there."""
    return f"{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}"


def name_of(pid: int) -> str:
    """The `name` of the process this host calls `pid`."""
    with open(f"/proc/{pid}/status") as status:
        inner = next(line for line in status if line.startswith("NSpid:")).split()[-1]
    return f"{os.stat(f'/proc/{pid}/ns/pid').st_ino}-{inner}"


def asleep(pid: int) -> bool:
    """Whether the main thread of `pid` waits in sigwait: it has closed its sockets."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return wchan.startswith("do_sigtimedwait") or syscall == _RT_SIGTIMEDWAIT.get(
        platform.machine())


async def until_asleep(pid: int, timeout: float) -> None:
    """Return once `pid` sleeps (a dump now catches it holding nothing outside); TimeoutError."""
    deadline = time.monotonic() + timeout
    while not asleep(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not go to sleep in {timeout} s")
        await asyncio.sleep(0.002)


def block() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {WAKE})


def sleep(socket_dir: Path) -> str:
    """Wait for `WAKE`; return the endpoint to connect to now."""
    global _parent
    _parent = None  # a copy restored elsewhere must not compare its new parent with this one
    block()
    signal.sigwait({WAKE})
    # A restored tree's root is the restorer's child: a parent-death signal inherited from
    # before the dump would now fire when one of the server's threads ends. It watches its
    # parent instead, which is the server (or, in a namespace of its own, its init).
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, 0)
    _parent = os.getppid()
    _watch_parent()
    return f"ipc://{restored_socket(socket_dir, name())}"


_parent: int | None = None  # the process that restored this one, while awake
_watching = False


def _watch_parent() -> None:
    """Leave once the process that restored this one is gone (this one is then another's
    child): a server killed outright leaves no restored worker behind. One thread, started at
    the first wake; a later dump and restore carries it along."""
    global _watching
    if _watching:
        return
    _watching = True

    def watch() -> None:
        while True:
            time.sleep(PARENT_EVERY)
            if _parent is not None and os.getppid() != _parent:
                os._exit(1)

    threading.Thread(target=watch, name="llfabric-parent", daemon=True).start()

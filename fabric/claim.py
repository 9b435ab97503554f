"""One server per store and per socket: an flock'd file in each names the server that holds it.

The lock is the kernel's (`fcntl.flock`): it ends with the process that holds it, so a server
killed with -9 leaves nothing to clean up, and a second server is refused at start, told which
one (pid, address) is in its way, instead of taking the socket or the store from under it.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from .errors import InUse


class Claims:
    """Descriptors of the lock files a server holds; `release` gives them back."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def take(self, path: Path, what: str, address: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            self.release()
            raise InUse(f"{what} is in use by the llfabric server with pid "
                        f"{holder.get('pid', '?')} serving {holder.get('address', '?')}; stop "
                        "it first, or give this one another store and address",
                        pid=holder.get("pid"), address=holder.get("address")) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "address": address}).encode(), 0)
        self.fds.append(fd)

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def claim_server(store: Path, address: str) -> Claims:
    """Lock `store` and, for an ipc:// address, its socket path, for this process."""
    claims = Claims()
    claims.take(Path(store) / "server.lock", f"the store {store}", address)
    if address.startswith("ipc://"):
        socket = address[len("ipc://"):]
        claims.take(Path(socket + ".lock"), f"the socket {socket}", address)
    return claims


def _holder(fd: int) -> dict:
    """What the holder wrote (empty in the instant between its lock and its write)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}

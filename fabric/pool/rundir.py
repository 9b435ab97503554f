"""A server's runtime folder (its workers' sockets, CRIU images), and the folders of servers
killed before they could remove theirs.

Each folder holds a lock its server keeps for its life (the kernel drops it when the server
dies, however it dies): a folder whose lock nobody holds belongs to a dead server, and the next
server this user starts removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "llfabric-"
LOCK = ".held"


def make() -> tuple[Path, int]:
    """A fresh runtime folder, and the descriptor whose lock marks it in use: keep it open for
    as long as the folder is; dead servers' folders are removed first (`clean`)."""
    clean()
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(tmp, folder / LOCK)  # locked before it is seen: no one takes it for a dead one
    return folder, fd


def clean() -> list[Path]:
    """Remove the runtime folders of this user's servers that died without removing them;
    the folders removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            found = os.lstat(folder)
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
                continue
            fd = os.open(folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # no lock: not a server's runtime folder (or one being made)
            continue
        try:
            with contextlib.suppress(BlockingIOError):  # held: its server is alive
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        finally:
            os.close(fd)
    return removed

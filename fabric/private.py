"""Directories and files only this process's user can change.

A directory in a shared place (/tmp) may have been made first by another user, so that our logs,
sockets and keys land where they can read or redirect them. The runtime, store and key
directories pass `private_dir` (made 0700, else refused unless ours and closed to others), and
the logs and keys in them are opened without following a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from .errors import UnsafePath


def private_dir(path: Path, shared: bool = False) -> Path:
    """Make `path` (mode 0700, parents as needed) or check that it is ours: a real directory
    owned by this user that no one else can write into. Unless `shared` (a socket directory
    other users reach on purpose), one that others could only read is closed to them."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        path.mkdir(parents=True, mode=0o700, exist_ok=True)
    check_dir(path, owners={os.geteuid()}, closed=0o022)
    if not shared and stat.S_IMODE(os.stat(path).st_mode) != 0o700:
        os.chmod(path, 0o700)  # ours, and no one could write into it: only reading is stopped
    return path


def check_dir(path: Path, owners: set[int], closed: int) -> None:
    """Refuse `path` unless it is a directory owned by one of `owners`, with none of the
    permission bits `closed`; a link is followed only if one of `owners` made it."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) and st.st_uid in owners:  # a store moved to a data disk
            st = os.stat(path)
    except FileNotFoundError as exc:
        raise UnsafePath(f"{path} does not exist", path=str(path)) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"refusing {path}: it is not a directory (a link or a file someone "
                         "put there?); remove it", path=str(path))
    if st.st_uid not in owners:
        raise UnsafePath(f"refusing {path}: it belongs to uid {st.st_uid}, not to uid "
                         f"{os.geteuid()} (another user may have made it to read or redirect "
                         "llfabric's files); remove it or use another directory",
                         path=str(path))
    if st.st_mode & closed:
        raise UnsafePath(f"refusing {path}: its mode {stat.S_IMODE(st.st_mode):04o} lets other "
                         f"users in; run `chmod {0o777 & ~closed:o} {path}`", path=str(path))


def open_private(path: Path, flags: int, mode: int = 0o600) -> int:
    """os.open that never follows a link at `path`; files it creates are 0600."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"refusing {path}: it is a symbolic link (someone may have made "
                             "it to redirect llfabric's writes); remove it",
                             path=str(path)) from exc
        raise


def write_new(path: Path, data: bytes) -> None:
    """Create `path` (0600, never over an existing file or link) holding `data`."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with open(fd, "wb") as f:
        f.write(data)


def read_private(path: Path) -> bytes:
    """A file of ours that no one else can read or write (a secret key), never through a link."""
    fd = open_private(path, os.O_RDONLY)
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UnsafePath(f"refusing {path}: a secret must belong to uid {os.geteuid()} "
                             f"with mode 0600 (it has uid {st.st_uid}, mode "
                             f"{stat.S_IMODE(st.st_mode):04o})", path=str(path))
        return f.read()


def log_tail(path: Path, size: int = 2000) -> str:
    """The last `size` bytes of a log we wrote, for an error that says why a child failed."""
    with contextlib.suppress(OSError), path.open("rb") as file:
        file.seek(max(0, path.stat().st_size - size))
        return file.read().decode(errors="replace").strip()
    return "(no log)"

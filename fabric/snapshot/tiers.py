"""Where blob bytes live: tiers, nearest first: memory, this host's disk, then what lies beyond
the host (a cluster's other hosts, remote storage).

A tier stores opaque bytes under an id and knows nothing of hashes or formats; the store verifies
what any tier returns. The store is given its tiers in order (`fabric.snapshot.layers`) and treats
each by its role: it reads the near ones in place and copies what they lack onto the disk from the
far ones, nearest first; a durable far tier holds a commit's blobs before its head moves
(`fabric.snapshot.commit`). A far tier that finds blobs before they are read (`Located`) or that
holds sessions' heads too (`Shared`) says so by the methods it has.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Protocol, TypeGuard, runtime_checkable

import xxhash

from ..errors import DiskFull, StoreError, UnsafePath

Buffer = bytes | bytearray | memoryview


class Role(Enum):
    """How the store writes and reads a tier."""

    CACHE = "cache"  # near and lost at exit: takes what is written and read, as it sees fit
    LOCAL = "local"  # this host's disk (one per store): every write, and what workers read
    FAR = "far"  # beyond this host: what the disk lacks is copied from it, nearest tier first


class Tier(Protocol):
    """A place blobs live. `durable`: a commit may only name blobs a durable tier holds; a far
    durable one is given a commit's blobs before its head moves."""

    @property
    def name(self) -> str:
        """As the store's counts and errors name it: "memory", "disk", "peer", "remote"."""
        ...

    @property
    def role(self) -> Role: ...

    @property
    def durable(self) -> bool: ...

    def has(self, ident: str) -> bool: ...

    def read_into(self, ident: str, out: memoryview) -> int | None:
        """Fill `out` with the blob; its true size (checked by the caller), None if absent."""
        ...

    def size(self, ident: str) -> int | None: ...

    def write(self, ident: str, data: Buffer) -> None: ...


@runtime_checkable
class Located(Tier, Protocol):
    """A far tier that finds where blobs are before they are read: a cluster's other hosts,
    which also hold manifests and sessions' heads, and keep versions they are asked to, after a
    commit, where no durable tier holds it (`fabric.snapshot.commit.spread`)."""

    @property
    def copies(self) -> int:
        """The hosts, this one included, each commit is to be kept on."""
        ...

    def locate(self, idents: list[str]) -> dict[str, int]:
        """Which of `idents` it holds, and their sizes."""
        ...

    def manifest(self, ident: str) -> bytes | None:
        """A manifest as a store keeps it (signed, unchecked here), None if no host has it."""
        ...

    def heads(self, session: str) -> list[str]:
        """The heads the hosts that answer hold of `session`."""
        ...

    def keep(self, session: str, head: str) -> list[str]:
        """Have `copies - 1` hosts hold version `head` of `session` whole; the names of those
        that do (fewer when fewer can)."""
        ...


@runtime_checkable
class Shared(Tier, Protocol):
    """A durable far tier several hosts share, which holds manifests, sessions' heads and tags
    as well as blobs: the authority on a session's head (`fabric.snapshot.remote`)."""

    def manifest(self, ident: str) -> bytes | None:
        """A manifest as a store keeps it (signed, unchecked here), None if absent."""
        ...

    def put_manifest(self, ident: str, data: bytes) -> None: ...

    def head(self, session: str) -> str | None:
        """The session's head as last written there (a hint: `adopt` follows the claims)."""
        ...

    def adopt(self, session: str) -> str | None:
        """The session's newest head, past any host lost before it wrote its head."""
        ...

    def move(self, session: str, manifest: str, parent: str | None) -> None:
        """Move the session's head from `parent` to `manifest`: StaleHead if another host moved
        it on from there first."""
        ...

    def tags(self, session: str) -> dict[str, str]:
        """The names the session's versions were given: tag -> manifest id."""
        ...

    def put_tag(self, session: str, tag: str, manifest: str) -> None: ...

    def forget(self, session: str) -> bool:
        """Remove the session (its head, claims and tags); False if it was not there."""
        ...


_ID = re.compile("[0-9a-f]{32}")


def valid_id(ident: object) -> TypeGuard[str]:
    """Whether `ident` is a blob's (or a manifest's) name: 32 lowercase hex digits."""
    return isinstance(ident, str) and _ID.fullmatch(ident) is not None


def fsync_dir(path: Path) -> None:
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomic(path: Path, data: Buffer, sync_dir: bool = True) -> None:
    """Write `data` to `path` durably: temp file, fsync, rename, directory fsync."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    except OSError as exc:
        raise _full(exc, path) from exc
    try:
        with open(fd, "wb", buffering=0) as f:
            view = memoryview(data).cast("B")
            while view:  # a raw write may be short
                view = view[f.write(view):]
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _full(exc, path) from exc
        raise
    if sync_dir:
        fsync_dir(path.parent)


def _full(exc: OSError, path: Path) -> OSError | DiskFull:
    """A full disk or quota as the typed error the user is told; any other OSError as it is."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return exc
    return DiskFull(f"no space left for {path.parent}: {exc.strerror}", path=str(path.parent))


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK:
          "a block device", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory",
          stat.S_IFLNK: "a symbolic link"}


def _refused(path: Path, mode: int) -> StoreError:
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return StoreError(f"{path} is {kind}, not a file the store wrote: refused, as if missing",
                      path=str(path), blob=path.name)


def open_regular(path: Path) -> int | None:
    """A read-only descriptor of the regular file at `path`; None if there is none. Whoever
    can write its folder (a user, in their part of the store) may have put anything there:
    it is opened without following a link and without blocking (a FIFO would wait for a
    writer), and anything but a regular file is refused (StoreError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise _refused(path, stat.S_IFLNK) from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refused(path, mode)
    return fd


def read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of the regular file at `path` (`open_regular`), refused if over `limit`
    bytes; None if there is none."""
    fd = open_regular(path)
    if fd is None:
        return None
    with open(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size > limit:
            raise StoreError(f"{path} holds {size} bytes, more than the {limit} it may: "
                             "refused", path=str(path))
        return f.read(size)  # what grew meanwhile is left unread: its check refuses it


def _owned_by(fd: int, uid: int, path: Path) -> None:
    if os.fstat(fd).st_uid != uid:
        raise UnsafePath(f"refusing {path}: not its user's", path=str(path))


class DiskTier:
    """Blobs as files ``<root>/ab/<id>``, written atomically and durably."""

    name, role, durable = "disk", Role.LOCAL, True

    def __init__(self, root: Path, owner: tuple[int, int] | None = None) -> None:
        """`owner`: the (uid, gid) the folder belongs to, when this process (the server) writes
        into another user's blobs (`fabric.users`): its blobs and shards are given to them, and
        nothing the user could have made a link is followed."""
        self.root = root
        self.owner = owner
        root.mkdir(parents=True, exist_ok=True)

    def __str__(self) -> str:
        return str(self.root)

    def path(self, ident: str) -> Path:
        return self.root / ident[:2] / ident

    def has(self, ident: str) -> bool:
        """Whether a blob is here as a regular file (what else a user put there is not)."""
        try:
            return stat.S_ISREG(os.lstat(self.path(ident)).st_mode)
        except FileNotFoundError:
            return False

    def size(self, ident: str) -> int | None:
        """A blob's size; None if absent, StoreError if it is not a regular file."""
        path = self.path(ident)
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(found.st_mode):
            raise _refused(path, found.st_mode)
        return found.st_size

    def read_into(self, ident: str, out: memoryview) -> int | None:
        fd = open_regular(self.path(ident))
        if fd is None:
            return None
        with open(fd, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size != len(out):
                return size
            got = 0
            while got < size:
                n = f.readinto(out[got:])
                if not n:
                    return got  # shrank under us
                got += n
        return size

    def write(self, ident: str, data: Buffer) -> None:
        if self.owner is None:
            write_atomic(self.path(ident), data)
            return
        try:
            self._write_theirs(ident, data, *self.owner)
        except OSError as exc:
            raise _full(exc, self.path(ident)) from exc

    def _write_theirs(self, ident: str, data: Buffer, uid: int, gid: int) -> None:
        """Write a blob into a folder its user owns, as they would have: every step through
        an open folder, never a name they could swap for a link, and the shard and blob theirs
        (a shard of the server's would refuse their workers' later blobs)."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        root = os.open(self.root, flags)
        try:
            _owned_by(root, uid, self.root)
            try:
                os.mkdir(ident[:2], 0o700, dir_fd=root)
                made = True
            except FileExistsError:
                made = False
            shard = os.open(ident[:2], flags, dir_fd=root)
        finally:
            os.close(root)
        try:
            if made:
                os.fchown(shard, uid, gid)
            _owned_by(shard, uid, self.root / ident[:2])
            tmp = f".tmp-{os.urandom(6).hex()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                         dir_fd=shard)
            try:
                with open(fd, "wb", buffering=0) as f:
                    os.fchown(f.fileno(), uid, gid)
                    view = memoryview(data).cast("B")
                    while view:  # a raw write may be short
                        view = view[f.write(view):]
                    os.fsync(f.fileno())
                os.rename(tmp, ident, src_dir_fd=shard, dst_dir_fd=shard)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=shard)
                raise
            os.fsync(shard)
        finally:
            os.close(shard)

    def digest(self, ident: str) -> str | None:
        """A blob's hash, streamed (its size bounds no memory); None if absent."""
        fd = open_regular(self.path(ident))
        if fd is None:
            return None
        digest, buffer = xxhash.xxh3_128(), bytearray(1 << 20)
        with open(fd, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                digest.update(memoryview(buffer)[:n])
        return digest.hexdigest()

    def touch(self, ident: str) -> None:
        """Mark a blob as just reused, so a concurrent gc's grace period covers it."""
        os.utime(self.path(ident), follow_symlinks=False)

    def remove(self, ident: str) -> None:
        self.path(ident).unlink(missing_ok=True)

    def files(self) -> Iterator[Path]:
        """Every file under the tier: blobs, and temp files a crash may have left. A shard
        that is a link is no part of it (a user who owns the folder could point one at another
        user's blobs, for gc to delete)."""
        for shard in sorted(self.root.iterdir()):
            if shard.is_dir() and not shard.is_symlink() and len(shard.name) == 2:
                yield from sorted(shard.iterdir())


class MemoryTier:
    """A least-recently-used cache of blobs up to `capacity` bytes, shared by threads.

    It holds indexes, manifests and small groups; a large chunk is not copied in (the copy would
    cost as much as the read it saves, and the page cache already holds it).
    """

    name, role, durable = "memory", Role.CACHE, False

    def __init__(self, capacity: int, largest: int = 1 << 20) -> None:
        self.capacity = capacity
        self.largest = min(largest, capacity // 4)
        self.used = 0
        self._blobs: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def has(self, ident: str) -> bool:
        with self._lock:
            return ident in self._blobs

    def size(self, ident: str) -> int | None:
        with self._lock:
            data = self._blobs.get(ident)
        return None if data is None else len(data)

    def read_into(self, ident: str, out: memoryview) -> int | None:
        with self._lock:
            data = self._blobs.get(ident)
            if data is None:
                return None
            self._blobs.move_to_end(ident)
        if len(data) == len(out):
            out[:] = data
        return len(data)

    def write(self, ident: str, data: Buffer) -> None:
        size = memoryview(data).nbytes
        if size > self.largest:
            return
        blob = bytes(data)
        with self._lock:
            if ident in self._blobs:
                return
            self._blobs[ident] = blob
            self.used += size
            while self.used > self.capacity:
                _, old = self._blobs.popitem(last=False)
                self.used -= len(old)

"""Which chunks of large buffers were written since a save hashed them, as the kernel saw it.

A save learns whether a buffer changed by hashing it, so a cell that only read a 10 GB array
would spend seconds hashing it again. Here the kernel keeps count instead. Before a chunk is
hashed its pages are write-protected (a userfaultfd in asynchronous write-protect mode: the
kernel lets the write through itself and only marks the page), and at the next save
/proc/self/pagemap (PAGEMAP_SCAN) names the pages written since. A chunk whose pages are all
present and unwritten holds the bytes it was hashed with: its id is reused, unhashed.
(The kernel's soft-dirty bits, which CRIU's incremental dumps read, would serve as well where it
has them, but CRIU's dumps clear them and kernels are often built without them.)

Every write through this process's page tables marks a page: Python, numpy, torch, C code, and
the kernel's own copies into user memory (a read(2) into a buffer). Writes that do not go
through them are not seen, so their memory is never trusted:

- memory shared with other processes, or mapped from a file that may change: only private
  anonymous memory and the store's own chunk files (never written in place) are tracked;
- pinned host memory, which a device writes by DMA: a buffer CUDA has pinned (asked of torch
  once CUDA is initialized) is not tracked, and nothing is while the process has pages pinned
  for DMA otherwise (VmPin: RDMA, io_uring's fixed buffers).

A page that is not present proves nothing (swapped out, released by madvise, remapped): its
chunk is hashed. A range that is no longer registered (unmapped and mapped again, moved by
mremap) is tracked afresh. Reading the marks and protecting the pages again is one atomic scan,
whose findings go to every buffer on those pages, so buffers sharing pages never hide a write
from each other. A forked child starts with nothing (its pages are not protected), and a process
about to be dumped calls `reset` (CRIU refuses to dump a userfaultfd): its restored copies start
afresh too.

A buffer's first and last pages are often shared with other memory (a buffer from the heap sits
between malloc's own bookkeeping and other objects, written all the time): a write there need not
be the buffer's. The buffer's bytes on such a page are compared with a digest of them instead,
taken when its chunk was hashed, with the page protected from before the digest to after the
hash, so that the digest holds exactly the bytes the id was hashed from.

A write to a protected page traps once (a few microseconds a 4 KiB page, several times the cost
of hashing it), so a chunk found changed is left unprotected after its hash, since it is likely
written again, and is hashed at the next save like any other; one found unchanged stays
protected.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import os
import platform
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .store import blob_id, hash_parts

PAGE = os.sysconf("SC_PAGE_SIZE")
KEEP = 16384  # buffers remembered at most, the least recently saved forgotten first
_BIG = 1 << 26  # bytes from which a buffer is looked for apart when finding what shares pages

_NR_USERFAULTFD = {"x86_64": 323, "aarch64": 282}
_UFFD_USER_MODE_ONLY = 1  # enough for write-protect: its faults are resolved by the kernel
_FEATURES = (1 << 15) | (1 << 13)  # UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED
_REGISTER_MODE_WP = 1 << 1
_WRITEPROTECT_MODE_WP = 1
_SCAN_WP_MATCHING, _SCAN_CHECK_WPASYNC = 1, 2
_PAGE_IS_WRITTEN, _PAGE_IS_PRESENT = 1 << 1, 1 << 3
_RUNS = 512  # page runs one scan call returns at most


def _iowr(kind: int, number: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (kind << 8) | number


class _Api(ctypes.Structure):
    _fields_ = [("api", ctypes.c_uint64), ("features", ctypes.c_uint64),
                ("ioctls", ctypes.c_uint64)]


class _Range(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Register(ctypes.Structure):
    _fields_ = [("range", _Range), ("mode", ctypes.c_uint64), ("ioctls", ctypes.c_uint64)]


class _WriteProtect(ctypes.Structure):
    _fields_ = [("range", _Range), ("mode", ctypes.c_uint64)]


class _Run(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64),
                ("categories", ctypes.c_uint64)]


class _Scan(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages",
        "category_inverted", "category_mask", "category_anyof_mask", "return_mask")]


_UFFDIO_API = _iowr(0xAA, 0x3F, ctypes.sizeof(_Api))
_UFFDIO_REGISTER = _iowr(0xAA, 0x00, ctypes.sizeof(_Register))
_UFFDIO_WRITEPROTECT = _iowr(0xAA, 0x06, ctypes.sizeof(_WriteProtect))
_PAGEMAP_SCAN = _iowr(ord("f"), 16, ctypes.sizeof(_Scan))


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
    return libc


def _ioctl(libc: ctypes.CDLL, fd: int, request: int, arg: ctypes.Structure) -> int:
    result = libc.ioctl(fd, request, ctypes.byref(arg))
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def _pages(address: int, nbytes: int) -> tuple[int, int]:
    """The page-aligned range holding `nbytes` at `address`."""
    return address - address % PAGE, -(-(address + nbytes) // PAGE) * PAGE


def _inner_pages(address: int, nbytes: int) -> tuple[int, int]:
    """The whole pages within `nbytes` at `address` (an empty range if none)."""
    return -(-address // PAGE) * PAGE, (address + nbytes) // PAGE * PAGE


@dataclass
class _Edge:
    """A page a buffer shares with other memory at one of its ends: the buffer's bytes on it,
    the chunk that holds them, the digest of those bytes its id was hashed with (see the
    module's note), and whether the page was written since it was last protected."""

    page: int
    start: int
    end: int
    chunk: int
    digest: str | None = None
    written: bool = False

    def now(self) -> str:
        return blob_id(ctypes.string_at(self.start, self.end - self.start))


def _edges(address: int, nbytes: int, chunk: int) -> list[_Edge]:
    """The pages at the ends of `nbytes` at `address` that it shares with other memory, where
    one chunk holds its bytes there."""
    first, end = _pages(address, nbytes)
    if chunk < PAGE or end - first <= PAGE:
        return []
    out: list[_Edge] = []
    if address % PAGE:
        out.append(_Edge(first, address, first + PAGE, 0))
    tail = end - PAGE
    if (address + nbytes) % PAGE and (tail - address) // chunk == (nbytes - 1) // chunk:
        out.append(_Edge(tail, tail, address + nbytes, (nbytes - 1) // chunk))
    return out


@dataclass
class _Buffer:
    """A tracked buffer: each chunk's id as last hashed (None: being hashed, or never was),
    whether it may have been written since, the ids before the hash under way, and its edges
    (`_Edge`)."""

    ids: list[str | None]
    stale: list[bool]
    previous: list[str | None]
    edges: list[_Edge]


class Tracker:
    """This process's protected buffers, by (address, bytes, chunk size)."""

    def __init__(self) -> None:
        nr = _NR_USERFAULTFD.get(platform.machine())
        if sys.platform != "linux" or nr is None:
            raise OSError("write tracking needs Linux on x86_64 or aarch64")
        self._libc = _libc()
        self.pid = os.getpid()
        fd = self._libc.syscall(nr, os.O_CLOEXEC | os.O_NONBLOCK | _UFFD_USER_MODE_ONLY)
        if fd < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"no userfaultfd: {os.strerror(error)}")
        self._uffd = fd
        try:
            api = _Api(0xAA, _FEATURES, 0)
            _ioctl(self._libc, fd, _UFFDIO_API, api)  # EINVAL: no asynchronous write-protect
            self._pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(fd)
            raise
        self._files = {fd: os.fstat(fd), self._pagemap: os.fstat(self._pagemap)}
        self._buffers: collections.OrderedDict[tuple[int, int, int], _Buffer] = \
            collections.OrderedDict()
        self._keys: list[tuple[int, int, int]] = []  # the same, sorted: by address
        self._big: set[tuple[int, int, int]] = set()  # those of _BIG bytes or more
        # each buffer's others on a page of its own: what protecting its pages hides from them
        self._near: dict[tuple[int, int, int], set[tuple[int, int, int]]] = {}
        try:
            self._scan(0, 0, set())  # ENOTTY: a kernel before 6.7, without PAGEMAP_SCAN
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        """Give up every protection (closing the userfaultfd unregisters its ranges)."""
        self._buffers.clear()
        self._keys.clear()
        self._big.clear()
        self._near.clear()
        for fd in (self._uffd, self._pagemap):
            os.close(fd)

    def intact(self) -> bool:
        """Whether our descriptors are still ours (user code may close and reuse them)."""
        try:
            return all(os.path.samestat(os.fstat(fd), seen) for fd, seen in self._files.items())
        except OSError:
            return False

    def prepare(self, address: int, nbytes: int, chunk: int,
                trusted: Callable[[int, int], bool]) -> list[str | None] | None:
        """Each chunk's id where its pages are provably unwritten since it was hashed, else None;
        the pages of the None chunks are protected now, so what writes them from now on is seen
        (hash them next, then call `hashed`). None for a buffer that cannot be tracked:
        `trusted` says whether a page range may be (see the module's note)."""
        key = (address, nbytes, chunk)
        first, end = _pages(address, nbytes)
        count = -(-nbytes // chunk)
        buffer = self._buffers.get(key)
        if buffer is not None:
            self._buffers.move_to_end(key)  # the most recently saved, last
            try:
                self._scan(first, end, {key, *self._near[key]})
            except OSError:  # part of it was unmapped, or mapped anew: tracked afresh below
                self._drop(key)
            else:
                changed = {edge.chunk for edge in buffer.edges
                           if edge.written and edge.now() != edge.digest}
                reuse = [None if stale or i in changed else ident
                         for i, (ident, stale) in enumerate(zip(buffer.ids, buffer.stale,
                                                                strict=True))]
                # the others are protected from now on: a write during their hash is seen
                self._buffers[key] = _Buffer(reuse, [False] * count, buffer.ids, buffer.edges)
                self._unwritten(buffer.edges, reuse)
                return reuse
        if not trusted(first, end):
            return None
        near = self._sharing(first, end)
        try:
            _ioctl(self._libc, self._uffd, _UFFDIO_REGISTER,
                   _Register(_Range(first, end - first), _REGISTER_MODE_WP, 0))
            self._scan(first, end, near)
        except OSError:  # registered by someone else's userfaultfd, not private memory, ...
            return None
        unknown: list[str | None] = [None] * count
        edges = _edges(address, nbytes, chunk)
        self._buffers[key] = _Buffer(list(unknown), [False] * count, list(unknown), edges)
        self._unwritten(edges, unknown)
        bisect.insort(self._keys, key)
        if nbytes >= _BIG:
            self._big.add(key)
        self._near[key] = near
        for other in near:
            self._near[other].add(key)
        while len(self._buffers) > KEEP:
            self._drop(next(iter(self._buffers)))
        return unknown

    @staticmethod
    def _unwritten(edges: list[_Edge], ids: list[str | None]) -> None:
        """Just after a scan protected `edges`' pages: the digest of each whose chunk is about
        to be hashed (`hashed` keeps it only if its page stays unwritten until then)."""
        for edge in edges:
            edge.written = False
            if ids[edge.chunk] is None:
                edge.digest = edge.now()

    def _sharing(self, first: int, end: int) -> set[tuple[int, int, int]]:
        """The buffers with a page in [first, end): the big ones, and those that start at most
        _BIG bytes before it."""
        lo = bisect.bisect_left(self._keys, (first - _BIG - PAGE,))
        hi = bisect.bisect_left(self._keys, (end,))
        return {key for key in (*self._keys[lo:hi], *self._big)
                if _pages(key[0], key[1])[0] < end and _pages(key[0], key[1])[1] > first}

    def _drop(self, key: tuple[int, int, int]) -> None:
        del self._buffers[key]
        del self._keys[bisect.bisect_left(self._keys, key)]
        self._big.discard(key)
        for other in self._near.pop(key):
            self._near[other].discard(key)

    def hashed(self, address: int, nbytes: int, chunk: int, ids: list[str]) -> None:
        """Remember the ids of a buffer hashed after `prepare`. A chunk whose id changed since
        its last hash is unprotected: it will likely be written again, and a write to an
        unprotected page costs no trap (it is stale, and hashed at the next save)."""
        key = (address, nbytes, chunk)
        buffer = self._buffers.get(key)
        if buffer is None:
            return
        fresh = {i for i, ident in enumerate(buffer.ids) if ident is None}
        for edge in buffer.edges:  # its digest holds the bytes hashed if nothing wrote meanwhile
            if edge.chunk in fresh:
                try:
                    self._scan(edge.page, edge.page + PAGE, {key, *self._near[key]})
                except OSError:
                    edge.written = True
                if edge.written:
                    buffer.stale[edge.chunk] = True
                    edge.written = False
        for i, ident in enumerate(ids):
            if i not in fresh:  # reused: as a write since may have left it
                continue
            buffer.ids[i] = ident
            if buffer.previous[i] not in (None, ident):
                buffer.stale[i] = True
                # its own pages only: one it shares with the next chunk stays protected for it
                first, end = _inner_pages(address + i * chunk, min(chunk, nbytes - i * chunk))
                with contextlib.suppress(OSError):  # still protected: only slower to write
                    if end > first:
                        _ioctl(self._libc, self._uffd, _UFFDIO_WRITEPROTECT,
                               _WriteProtect(_Range(first, end - first), 0))

    def _scan(self, first: int, end: int, on: set[tuple[int, int, int]]) -> None:
        """Find the pages in [first, end) not provably unwritten (written, or not present) and
        write-protect them in the same walk; the buffers `on` (every one with a page there) are
        told (`_stale`). OSError if part of the range is not registered with us."""
        runs = (_Run * _RUNS)()
        flags = _SCAN_CHECK_WPASYNC | _SCAN_WP_MATCHING
        start = first
        while True:
            scan = _Scan(ctypes.sizeof(_Scan), flags, start, end, 0, ctypes.addressof(runs),
                         _RUNS, 0, _PAGE_IS_PRESENT, 0, _PAGE_IS_PRESENT | _PAGE_IS_WRITTEN,
                         _PAGE_IS_PRESENT | _PAGE_IS_WRITTEN)
            try:
                found = _ioctl(self._libc, self._pagemap, _PAGEMAP_SCAN, scan)
            except OSError:  # it may have protected pages before it stopped, untold which
                if end > start:
                    self._stale([(start, end)], on)
                raise
            if found:
                self._stale([(runs[i].start, runs[i].end) for i in range(found)], on)
            if scan.walk_end >= end or found == 0:
                return
            start = scan.walk_end

    def _stale(self, runs: list[tuple[int, int]], on: set[tuple[int, int, int]]) -> None:
        """Mark the chunks of the buffers `on` with pages in `runs` stale, but for the pages of
        their edges: those are marked written."""
        for key in on:
            address, nbytes, chunk = key
            buffer = self._buffers[key]
            first, last = _pages(address, nbytes)
            for start, end in runs:
                start, end = max(start, first), min(end, last)
                for edge in buffer.edges:
                    if start <= edge.page < end:
                        edge.written = True
                        if edge.page == start:
                            start += PAGE
                        else:  # the last page
                            end -= PAGE
                if start >= end:
                    continue
                lo = (max(start, address) - address) // chunk
                hi = (min(end, address + nbytes) - address - 1) // chunk
                for i in range(lo, hi + 1):
                    buffer.stale[i] = True


_tracker: Tracker | None = None
_why: str | None = None  # why this process cannot track writes, once it tried


def tracker() -> Tracker | None:
    """This process's tracker, opened on first use; None where the kernel cannot track writes
    (`why` says why)."""
    global _tracker, _why
    if _tracker is not None and (_tracker.pid != os.getpid() or not _tracker.intact()):
        _tracker = None  # a fork's copy, or its descriptors were closed: nothing it knew holds
    if _tracker is None and _why is None:
        try:
            _tracker = Tracker()
        except OSError as exc:
            _why = str(exc)
    return _tracker


def why() -> str | None:
    """Why this process does not track writes (None while it does, or has not tried)."""
    return _why


def reset() -> None:
    """Forget every buffer and drop the protections: before this process is dumped, since what
    a restored copy's pages say is no news of our saves."""
    global _tracker
    if _tracker is not None:
        if _tracker.pid == os.getpid():
            _tracker.close()
        _tracker = None


def _forget_in_child() -> None:
    """A forked child's pages are not protected, and the userfaultfd it inherited is the
    parent's: it must never use it (protecting through it would hide the parent's writes)."""
    global _tracker
    if _tracker is not None:
        _tracker.close()  # the child's copies of the descriptors: the parent's stay open
        _tracker = None


os.register_at_fork(after_in_child=_forget_in_child)


class Hashing:
    """The chunk ids of one save's large buffers (`Store.put_object`'s `chunk_ids`): those the
    tracker proves unwritten since their last hash are reused, the rest hashed; `hashed` and
    `reused` count the bytes of each."""

    def __init__(self, tracker: Tracker | None, immutable: Path) -> None:
        """`immutable`: the folder of the store's blob files, whose mappings may be tracked."""
        # pages pinned for a device or io_uring (VmPin) may be written by it, unseen
        self.tracker = tracker if tracker is not None and not _pinned_pages() else None
        self.immutable = os.path.realpath(immutable) + os.sep
        self.hashed = self.reused = 0
        self._maps: list[tuple[int, int, bool]] | None = None  # read once a save, when needed

    def __call__(self, views: list[memoryview], chunk: int) -> list[list[str]]:
        cuts = [[view[start:start + chunk] for start in range(0, view.nbytes, chunk)]
                for view in views]
        known = [self._prepare(view, chunk) for view in views]
        todo = [part for cut, ids in zip(cuts, known, strict=True)
                for part, ident in zip(cut, ids or [None] * len(cut), strict=True)
                if ident is None]
        fresh = iter(hash_parts(todo))
        self.hashed += sum(part.nbytes for part in todo)
        out: list[list[str]] = []
        for view, cut, ids in zip(views, cuts, known, strict=True):
            chunk_ids = [ident if ident is not None else next(fresh)
                         for ident in ids or [None] * len(cut)]
            self.reused += sum(part.nbytes for part, ident in zip(cut, ids or (), strict=False)
                               if ident is not None)
            if ids is not None and self.tracker is not None:
                self.tracker.hashed(_address(view), view.nbytes, chunk, chunk_ids)
            out.append(chunk_ids)
        return out

    def seed(self, views: list[memoryview], chunk: int, ids: list[list[str]]) -> None:
        """Track buffers whose chunks are known to have the ids `ids` (a load verified them)
        and that nothing can have written since: their next save hashes only what is."""
        for view, known in zip(views, ids, strict=True):
            if self._prepare(view, chunk) is not None and self.tracker is not None:
                self.tracker.hashed(_address(view), view.nbytes, chunk, known)

    def _prepare(self, view: memoryview, chunk: int) -> list[str | None] | None:
        if self.tracker is None or _pinned(view):
            return None
        return self.tracker.prepare(_address(view), view.nbytes, chunk, self._trusted)

    def _trusted(self, first: int, end: int) -> bool:
        """Whether [first, end) is private memory that only this process writes: anonymous, or
        the store's own files."""
        if self._maps is None:
            self._maps = _private_maps(self.immutable)
        covered = first
        for start, stop, ok in self._maps:
            if stop <= covered or start >= end:
                continue
            if start > covered or not ok:
                return False
            covered = stop
            if covered >= end:
                return True
        return False


def _private_maps(immutable: str) -> list[tuple[int, int, bool]]:
    """This process's mappings, each with whether its pages change only through its writes."""
    out: list[tuple[int, int, bool]] = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, _, stop = fields[0].partition("-")
            path = fields[5].rstrip("\n") if len(fields) > 5 else ""
            anonymous = fields[4] == "0" and (path in ("", "[heap]") or path.startswith("[anon:"))
            ok = fields[1][3] == "p" and (anonymous or path.startswith(immutable))
            out.append((int(start, 16), int(stop, 16), ok))
    return out


def _pinned_pages() -> bool:
    """Whether this process has pages pinned for DMA (RDMA, io_uring's fixed buffers)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmPin:"):
                return line.split()[1] != "0"
    return True  # a kernel that does not say: doubtful


def _address(view: memoryview) -> int:
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def _pinned(view: memoryview) -> bool:
    """Whether a device may write `view` by DMA, unseen: pinned host memory, in a process that
    uses CUDA (doubtful ones count as pinned)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only view: torch warns, and only reads it
            return bool(torch.frombuffer(view, dtype=torch.uint8).is_pinned())
    except (RuntimeError, TypeError, ValueError):
        return True

"""Which chunks each object names, remembered across restarts.

gc needs the chunk list of every live object; read from the objects' indexes, the first pass
after a start would read each index whole (its pickle stream and small buffers too). The server
keeps the lists it has read beside the manifests, one line per object::

    <object id> <chunk id>,<chunk id>,... <xxh3-64 of what precedes it>

A line is appended to `chunks` once its object's index was read and checked against its id; the
appended lines are merged now and then into `chunks.sorted`, written afresh in the order of the
objects' ids. A pass that needs a few lists after a start reads both files, parses the appended
lines and finds the others by bisection, parsing only those it asks for: its cost grows with what
was appended since the last merge, not with the store. A merge waits until the appended lines,
and the lines of objects gc removed, pass an eighth of the sorted file's, so that each line is
written a bounded number of times however large the store grows.

An id names one content, so a line never goes stale; a line a crash cut short, or any that does
not check, is skipped, and that object's index is read again when asked for (its line appended
anew replaces the bad one at the next merge). Only the server writes the files (they lie in the
store's root, not in a user's blobs): a worker's view of the store remembers in memory only.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import xxhash

from .tiers import read_regular, valid_id, write_atomic

FILE_BYTES = 1 << 30  # far past any store's: a larger file is left unread
MERGE_LINES = 1024  # a merge waits for more lines changed (appended, or removed) than this
MERGE_SHARE = 8  # and than 1/MERGE_SHARE of the sorted lines
_KEY = 32  # a line's object id, in hex digits


@dataclasses.dataclass
class _Files:
    """The two files as read at first use, and what changed since."""

    sorted: bytes  # the sorted file's lines, as read
    lines: int | None  # how many it holds, once counted
    appended: dict[bytes, bytes]  # the appended lines by their object's id, not checked yet
    added: int  # lines appended since the last merge
    gone: set[bytes]  # objects gc removed, whose lines the next merge drops


class ChunkLists:
    def __init__(self, path: Path | None) -> None:
        """`path`: the file of appended lines (the sorted one beside it); None: remembered in
        memory only."""
        self.path = path
        self._lists: dict[str, tuple[str, ...]] = {}  # checked
        self._files: _Files | None = None
        self._lock = threading.Lock()

    def get(self, ident: str) -> tuple[str, ...] | None:
        with self._lock:
            return self._get(ident)

    def add(self, ident: str, chunks: tuple[str, ...]) -> None:
        """Remember an object's chunks, read from its index as checked against its id."""
        with self._lock:
            if self._get(ident) is not None:
                return
            self._lists[ident] = chunks
            if self.path is None:
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            try:  # one write: lines of several writers never interleave
                os.write(fd, _line(ident, chunks))
            finally:
                os.close(fd)
            files = self._read()
            files.added += 1
            files.gone.discard(ident.encode())
            self._merge_if_due(files)

    def forget(self, ident: str) -> None:
        """Forget an object gc removed; its line goes at the next merge."""
        with self._lock:
            known = self._lists.pop(ident, None) is not None
            if self.path is None:
                return
            files, key = self._read(), ident.encode()
            if files.appended.pop(key, None) is not None or known or \
                    _find(files.sorted, key) is not None:
                files.gone.add(key)
                self._merge_if_due(files)

    def _get(self, ident: str) -> tuple[str, ...] | None:
        found = self._lists.get(ident)
        if found is None and self.path is not None:
            files, key = self._read(), ident.encode()
            line = files.appended.pop(key, None) or _find(files.sorted, key)
            parsed = _parsed(line) if line is not None else None
            if parsed is not None and parsed[0] == ident:
                found = self._lists[ident] = parsed[1]
                files.gone.discard(key)  # asked for again: its object is back
        return found

    def _read(self) -> _Files:
        if self._files is None:
            assert self.path is not None
            ordered = read_regular(self._sorted_path(), FILE_BYTES) or b""
            appended = _split(read_regular(self.path, FILE_BYTES) or b"")
            self._files = _Files(ordered, None, {line[:_KEY]: line for line in appended},
                                 len(appended), set())
            self._merge_if_due(self._files)  # as an earlier version left the files
        return self._files

    def _sorted_path(self) -> Path:
        assert self.path is not None
        return self.path.with_name(f"{self.path.name}.sorted")

    def _merge_if_due(self, files: _Files) -> None:
        """Write the sorted file afresh, once enough changed since it was: its lines and the
        appended ones (those that check, in its place of a line of the same object), less the
        removed objects'; then empty the appended file."""
        assert self.path is not None
        changed = files.added + len(files.gone)
        if changed <= MERGE_LINES:
            return
        if files.lines is None:  # only now: a pass that asks for a few lists leaves it be
            files.lines = files.sorted.count(b"\n")
        if changed <= files.lines // MERGE_SHARE:
            return
        lines = {line[:_KEY]: line for line in _split(files.sorted)}
        # read again: lines other processes appended, and those parsed since they were read
        lines.update((line[:_KEY], line)
                     for line in _split(read_regular(self.path, FILE_BYTES) or b"")
                     if _parsed(line) is not None)
        for key in files.gone:
            lines.pop(key, None)
        ordered = b"".join(line + b"\n" for _, line in sorted(lines.items()))
        write_atomic(self._sorted_path(), ordered)
        write_atomic(self.path, b"")  # a line appended meanwhile is lost: read again if asked
        files.sorted, files.lines, files.added = ordered, len(lines), 0
        files.appended.clear()
        files.gone.clear()


def _split(data: bytes) -> list[bytes]:
    return [line for line in data.split(b"\n") if line]


def _find(data: bytes, key: bytes) -> bytes | None:
    """The line of `data` that starts with `key`, found by bisection where its lines are in the
    order of their keys; None if there is none (or they are not in order)."""
    low, high = 0, len(data)  # where lines start
    while low < high:
        start = data.rfind(b"\n", low, (low + high) // 2) + 1 or low  # of the line there
        end = data.find(b"\n", start, high)
        end = high if end < 0 else end
        found = data[start:start + _KEY]
        if found == key:
            return data[start:end]
        low, high = (end + 1, high) if found < key else (low, start)
    return None


def _line(ident: str, chunks: tuple[str, ...]) -> bytes:
    body = f"{ident} {','.join(chunks)}".encode()
    return body + b" " + xxhash.xxh3_64_hexdigest(body).encode() + b"\n"


def _parsed(line: bytes) -> tuple[str, tuple[str, ...]] | None:
    """A line's object and chunks; None for one cut short or that does not check."""
    body, _, check = line.rpartition(b" ")
    if not body or xxhash.xxh3_64_hexdigest(body).encode() != check:
        return None
    ident, _, named = body.decode(errors="replace").partition(" ")
    chunks = tuple(named.split(",")) if named else ()
    if not valid_id(ident) or not all(map(valid_id, chunks)):
        return None
    return ident, chunks

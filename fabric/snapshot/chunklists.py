"""Which chunks each object names, remembered across restarts.

gc needs the chunk list of every live object; read from the objects' indexes, the first pass
after a start would read each index whole (its pickle stream and small buffers too). The server
keeps the lists it has read in one file beside the manifests, one line per object::

    <object id> <chunk id>,<chunk id>,... <xxh3-64 of what precedes it>

appended once the object's index was read and checked against its id. An id names one content,
so a line never goes stale; a line a crash cut short, or any that does not check, is skipped, and
that object's index is read again when asked for. A line is checked when its object is first
asked for: a pass that needs a few lists reads the file once and parses only those. Only the
server writes the file (it lies in the store's root, not in a user's blobs): a worker's view of
the store remembers in memory only. When more lines name objects gc removed than live ones, the
file is written afresh.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import xxhash

from .tiers import read_regular, valid_id, write_atomic

FILE_BYTES = 1 << 30  # far past any store's: a larger file is left unread


class ChunkLists:
    def __init__(self, path: Path | None) -> None:
        """`path`: the file; None: remembered in memory only."""
        self.path = path
        self._lists: dict[str, tuple[str, ...]] = {}  # checked
        # the file's lines by their object's id, read at first use and checked when asked for:
        # a pass that needs a few objects' lists parses those, not the whole file
        self._lines: dict[bytes, bytes] | None = None
        self._stale = 0  # lines in the file for objects gc removed
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
            if self.path is not None:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
                try:  # one write: lines of several writers never interleave
                    os.write(fd, _line(ident, chunks))
                finally:
                    os.close(fd)

    def forget(self, ident: str) -> None:
        """Forget an object gc removed; the file is rewritten once most of it is of such."""
        with self._lock:
            lines = self._file()
            known = self._lists.pop(ident, None) is not None
            known = lines.pop(ident.encode(), None) is not None or known
            if not known or self.path is None:
                return
            self._stale += 1
            if self._stale > max(len(self._lists) + len(lines), 1024):
                for line in lines.values():  # those still unchecked: only good ones are kept
                    if (parsed := _parsed(line)) is not None:
                        self._lists.setdefault(*parsed)
                lines.clear()
                write_atomic(self.path, b"".join(_line(i, c) for i, c in self._lists.items()))
                self._stale = 0

    def _get(self, ident: str) -> tuple[str, ...] | None:
        found = self._lists.get(ident)
        if found is None and (line := self._file().pop(ident.encode(), None)) is not None:
            parsed = _parsed(line)
            if parsed is not None and parsed[0] == ident:
                found = self._lists[ident] = parsed[1]
        return found

    def _file(self) -> dict[bytes, bytes]:
        if self._lines is None:
            data = read_regular(self.path, FILE_BYTES) if self.path is not None else None
            self._lines = {line[:32]: line for line in (data or b"").split(b"\n") if line}
        return self._lines


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

"""Retention and gc passes that cost what changed since the last one, not the whole store.

`history.retain` on every session and `history.gc` walk every session's history and list every
file; run after each commit on a store of 1,000 sessions, that is most of a server's time. A
`Ledger` keeps, for one store, what the last passes learned, and looks again only at

- the sessions whose head or index was written, or that were removed, since (in any process:
  the store marks them, `Store.take_changed`); at its first pass, every session the saved
  ledger does not hold as it is now (every session, without one);
- for retention, besides those, a session whose `due` time came (a version it kept leaves the
  policy's hours or days) or whose version kept only by protection lost it;
- for gc, the files that lost the last session holding them or that retention or removal
  released. It keeps what each session's history holds (`history.mark`) and how many sessions
  hold each file; at its first pass and every `grace` seconds after, it lists every file as
  `history.gc` does, for what no commit ever named (the writes of a save whose commit failed, a
  crash's leftovers): those are freed up to `grace` seconds later than a full pass would.

Of what retention and removal release, a pass frees exactly what `history.gc` would, under the
same rules (grace, touched since, saves in flight). A pass reads each changed session's history
once: gc marks what retention read.

The ledger is saved in the store's `ledger` file (at most every `SAVE_SECONDS`), so that the
first pass after a restart costs what changed since rather than the whole store: the whole
ledger, written atomically, then at each save a record of what changed since the last one,
appended durably, until those would pass half the whole one (a load reads them all) and the
whole ledger is written afresh. What a session holds is trusted only while the session's stamp
(`Store.stamp`: its head's and index's inode, size and times, taken before they were read)
is unchanged: a session written since the save, by any process, even with its change marks lost
to a crash, is read again; one the ledger does not know is read as at a first pass. Each record
is checked against its digest on load: an appended one that does not check (a save cut short)
is left out with any after it, and the ledger taken as the save before it left it, an older
ledger the stamps make as safe as any; a torn, corrupt or unreadable whole one is not trusted
at all, and the first pass reads every session, as without one.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import time
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import xxhash

from ..errors import StoreError
from . import history
from .counts import ID, Counts, pack_ids, unpack_ids
from .manifest import Manifest
from .packing import UnpackError, pack, unpack
from .retention import RetentionPolicy
from .store import Store, valid_session
from .tiers import read_regular, valid_id, write_atomic

log = logging.getLogger(__name__)

FILE = "ledger"  # in the store's root
SAVE_SECONDS = 60.0  # a save at most this often
FILE_BYTES = 1 << 30  # far past any store's: a larger file is not trusted
_MAGIC = b"LLFL\x02"
_HEAD = 4 + 16  # before each record: its size, and its xxh3-128 digest

Stamp = tuple[int, ...]
_GONE: Stamp = (0,) * 8  # the stamp of a session whose folder is gone


class Ledger:
    def __init__(self, store: Store, grace: float = history.GRACE_SECONDS) -> None:
        self.store = store
        self.grace = grace
        self.held: dict[str, bytes] = {}  # session -> the files its history holds, packed
        self.refs = Counts()  # file -> how many sessions hold it
        self.thinnings: dict[str, history.Thinning] = {}  # session -> its last retention
        self.damaged: dict[str, str] = {}  # session -> why its history cannot be read whole
        self.unthinned: set[str] = set()  # changed sessions retention has not looked at since
        self.pending: set[str] = set()  # and gc
        self.unsettled: set[str] = set()  # sessions whose releases wait for the next pass
        self.listed = -math.inf  # when a pass last listed every file
        self.kept = 0  # files and bytes kept: as last listed, since counted as they change
        self.kept_bytes = 0
        self.stamps: dict[str, Stamp] = {}  # session -> its stamp as what it holds was read
        self.saved = -math.inf  # when the ledger was last saved
        self._seen = False  # whether a pass has looked at every session
        self._read: dict[str, list[tuple[str, Manifest]]] = {}  # histories retention read
        self._unsaved = False
        # since the last save: the sessions whose entries changed, and how `refs` did
        self._dirty: set[str] = set()
        self._moved: collections.Counter[str] = collections.Counter()
        # the saved file as this ledger left it (`_identity`), and the size of its whole record,
        # to append to; None: the next save writes it whole
        self._file: tuple[Stamp, int] | None = None
        self._load()

    def _changes(self) -> set[str]:
        """The sessions changed since the last call (every session at the first)."""
        changed = set(self.store.take_changed())  # first: a write meanwhile is seen next time
        if not self._seen:  # those the saved ledger does not hold as they are
            found = self.store.stamps()
            changed |= {s for s in {*found, *self.stamps}
                        if self.stamps.get(s) != found.get(s, _GONE)}
            self._seen = True
        self.unthinned |= changed
        self.pending |= changed
        return changed

    def retain(self, policy: RetentionPolicy, protect: set[str], now: float | None = None
               ) -> int:
        """Thin, by `policy`, the sessions whose retention may have changed (`history.retain`);
        the versions thinned."""
        now = time.time() if now is None else now
        self._changes()
        stale = {s for s, t in self.thinnings.items() if t.due <= now or t.protected - protect}
        thinned = 0
        self._read.clear()
        for session in sorted(self.unthinned | stale):
            self.unthinned.discard(session)  # a pass that fails leaves the rest for the next
            self._unsaved = True
            self._dirty.add(session)
            read: list[tuple[str, Manifest]] = []
            try:
                thinning = history.thin(self.store, session, policy, protect, now, read) \
                    if self.store.head(session) is not None else None
                # for gc's marks: what they use of each version (its cell may be large)
                self._read[session] = [(i, dataclasses.replace(m, cell={}, env={}))
                                       for i, m in read]
            except StoreError as exc:  # a damaged session keeps everything; gc reports it
                log.warning("retention skipped session %s: %s", session, exc.message)
                thinning = None
            if thinning is None:  # removed, or damaged: looked at again once it changes
                self.thinnings.pop(session, None)
                continue
            self.thinnings[session] = thinning
            thinned += len(thinning.numbers)
        return thinned

    def collect(self, saving_since: float | None = None) -> history.Collected:
        """gc (`history.gc`) of what changed: re-read what the changed sessions hold, and free
        what no session holds any more, as `history.gc` would."""
        started = time.time()
        result = history.Collected()
        self._changes()
        sessions = sorted(self.pending | self.unsettled | set(self.damaged))
        stamps = self.store.stamps(sessions)  # before: a write meanwhile shows
        holds = {s: self._holds(s, result.damaged) for s in sessions}
        self._read.clear()
        if result.damaged:  # what they may still need: one read of every manifest for all
            kept: set[str] = set()
            history.keep_damaged(self.store, set(result.damaged), kept)
            for session in result.damaged:
                holds[session] |= kept
        moved = self._hold(holds)
        self._dirty.update(sessions)
        self._moved.update(moved)
        dropped, added = self.refs.change(moved)
        held = [s for s in sessions if s in self.held]
        freeable = history.released(self.store, held, result.damaged)
        if started - self.listed >= self.grace:
            self.listed = started
            history.sweep(self.store, self.refs.names(), held, history.listing(self.store),
                          freeable, result, started, self.grace, saving_since)
            self.kept, self.kept_bytes = result.kept, result.kept_bytes
        else:
            history.sweep(self.store, self.refs, held, self._stats(dropped | set(freeable)),
                          freeable, result, started, self.grace, saving_since)
            self.kept += len(added) - result.removed
            self.kept_bytes += sum(history.size_of(self.store, i) for i in added) - result.freed
            result.kept, result.kept_bytes = self.kept, self.kept_bytes
        self.unsettled = {s for s in held if s not in result.damaged and self._releasing(s)}
        # only now: a pass that fails leaves them for the next
        self.pending -= set(sessions)
        self.damaged = result.damaged
        for session in sessions:
            if session in self.held or session in self.damaged:
                self.stamps[session] = stamps[session]
            else:  # removed
                self.stamps.pop(session, None)
        self._unsaved |= bool(sessions) or self.listed == started
        if self._unsaved and time.time() - self.saved >= SAVE_SECONDS:
            try:
                self.save()
            except (OSError, StoreError) as exc:  # a full disk: the pass's frees stand
                log.warning("the ledger could not be saved (%s): a restart reads again what "
                            "changed since it last was", getattr(exc, "message", exc))
        return result

    def _holds(self, session: str, damaged: dict[str, str]) -> set[str]:
        """What the session's history holds now (nothing, once removed); of a damaged one,
        added to `damaged` with why, what it could read."""
        holds: set[str] = set()
        try:
            if (head := self.store.head(session)) is not None:
                read = self._read.get(session)  # a history is the same from the same head
                history.mark(self.store, session, holds, read if read and read[0][0] == head
                             else None)
        except StoreError as exc:
            damaged[session] = exc.message
        return holds

    def _hold(self, holds: dict[str, set[str]]) -> collections.Counter[str]:
        """Record what each session holds now; how the count of sessions holding each file
        changes."""
        changes: collections.Counter[str] = collections.Counter()
        for session, now in holds.items():
            now = set(filter(valid_id, now))
            before = unpack_ids(self.held.pop(session, b""))
            if now:
                self.held[session] = pack_ids(now)
            changes.update(now - before)
            changes.subtract(before - now)
        return changes

    def _stats(self, idents: Iterable[str]) -> dict[Path, os.stat_result]:
        """The files of `idents` (blobs or manifests) that are there, as `history.listing`."""
        stats: dict[Path, os.stat_result] = {}
        for ident in filter(valid_id, idents):
            for path in (self.store.disk.path(ident), self.store.root / "manifests" / ident):
                with contextlib.suppress(FileNotFoundError):
                    stats[path] = path.lstat()
        return stats

    def _releasing(self, session: str) -> bool:
        """Whether the session released versions a pass has not freed yet."""
        try:
            return any(self.store.index(session).thinned.values())
        except StoreError:
            return False

    def save(self) -> None:
        """Write the ledger (`FILE`) for the first pass after a restart: a record of what
        changed since the last save appended to the file this ledger wrote, durably; or the
        whole ledger, written atomically, where there is no such file or the records appended
        would pass half its whole record's size (a load reads them all). Each record carries the
        digest it is checked against on load."""
        path = self.store.root / FILE
        known, self._file = self._file, None  # a save cut short is followed by a whole one
        if known is not None and known[0] == _identity(path):
            record = _record(self._body(sorted(self._dirty), whole=False))
            if known[0][1] + len(record) <= known[1] * 3 // 2:
                self._file = (_appended(path, record), known[1])
        if self._file is None:
            data = _MAGIC + _record(self._body(list(self.stamps), whole=True))
            write_atomic(path, data)
            self._file = (_identity(path), len(data))
        self._dirty.clear()
        self._moved.clear()
        self.saved, self._unsaved = time.time(), False

    def _body(self, names: list[str], whole: bool) -> bytes:
        """A record of the entries of the sessions `names` (those gone: removed) and of the
        fields that are not by session; of `refs`, whole or how it moved since the last save.
        What is kept by session is kept by column (each a byte string, or a list msgpack reads
        in C), so that a load costs little more than reading the file, however many sessions
        it holds."""
        removed = [s for s in names if s not in self.stamps]
        names = [s for s in names if s in self.stamps]
        thinnings = [self.thinnings.get(s) for s in names]
        moved = {i: n for i, n in self._moved.items() if n}
        refs = self.refs.packed() if whole else \
            (pack_ids(moved), array("i", moved.values()).tobytes())
        return pack({"whole": whole, "sessions": names, "removed": removed,
                     "stamps": [n for s in names for n in self.stamps[s]],
                     "held": _column([self.held.get(s, b"") for s in names]),
                     "due": array("d", (t.due if t else math.nan for t in thinnings)).tobytes(),
                     "protected": _column([pack_ids(t.protected) if t else b""
                                           for t in thinnings]),
                     "refs": list(refs), "damaged": self.damaged,
                     "unthinned": sorted(self.unthinned), "pending": sorted(self.pending),
                     "unsettled": sorted(self.unsettled), "listed": self.listed,
                     "kept": self.kept, "kept_bytes": self.kept_bytes})

    def _load(self) -> None:
        """Take up the saved ledger, if there is one to trust."""
        path = self.store.root / FILE
        try:
            data = read_regular(path, FILE_BYTES)
            if data is None:
                return
            saved, whole = _decoded(data)
        except (StoreError, ValueError, TypeError, KeyError, AttributeError, UnpackError) as exc:
            log.warning("the ledger %s is not trusted (%s): the first pass reads every session",
                        path, getattr(exc, "message", exc))
            return
        self.stamps, self.held, self.thinnings = saved.stamps, saved.held, saved.thinnings
        self.refs = saved.refs
        self.damaged, self.unthinned, self.pending, self.unsettled = \
            saved.damaged, saved.unthinned, saved.pending, saved.unsettled
        now = time.time()
        self.listed = saved.listed if saved.listed <= now else -math.inf  # a clock set back
        self.kept, self.kept_bytes = saved.kept, saved.kept_bytes
        self.saved = min(os.stat(path).st_mtime, now)
        identity = _identity(path)
        if saved.clean and identity[1] == len(data):
            self._file = (identity, whole)


def _appended(path: Path, record: bytes) -> Stamp:
    """Append `record` to the file at `path`, durably; the file's `_identity` then."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        view = memoryview(record)
        while view:  # a write may be short
            view = view[os.write(fd, view):]
        os.fsync(fd)
        return _identity(fd)
    finally:
        os.close(fd)


def _identity(file: Path | int) -> Stamp:
    """What tells the file (a path or an open one) from any other, or from itself rewritten:
    its inode, size, and modification and change times (zeros where there is none)."""
    try:
        st = os.fstat(file) if isinstance(file, int) else os.lstat(file)
    except FileNotFoundError:
        return (0, 0, 0, 0)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclasses.dataclass
class _Saved:
    """A saved ledger, checked: by session, its stamp, what it holds (packed, only where it holds
    anything) and its last retention; how many sessions hold each file; and whether the file
    ends with its last record (not with one a save cut short)."""

    stamps: dict[str, Stamp]
    held: dict[str, bytes]
    thinnings: dict[str, history.Thinning]
    refs: Counts
    damaged: dict[str, str]
    unthinned: set[str]
    pending: set[str]
    unsettled: set[str]
    listed: float
    kept: int
    kept_bytes: int
    clean: bool = True


def _record(body: bytes) -> bytes:
    """A record as the file holds it: its size, its digest, itself."""
    return len(body).to_bytes(4, "little") + xxhash.xxh3_128_digest(body) + body


def _column(parts: list[bytes]) -> list[bytes]:
    """Packed ids by session, as one byte string and how many ids each part holds."""
    return [b"".join(parts), array("I", (len(p) // ID for p in parts)).tobytes()]


def _parts(column: object, count: int) -> list[bytes]:
    """The `count` parts a `_column` holds; ValueError if it cannot hold them."""
    data, sizes = cast(list[object], column)
    lengths = array("I")
    lengths.frombytes(cast(bytes, sizes))  # TypeError if not bytes
    if not isinstance(data, bytes) or len(lengths) != count or sum(lengths) * ID != len(data):
        raise ValueError("a bad column")
    return [data[(end - n) * ID:end * ID] for end, n in zip(itertools.accumulate(lengths),
                                                             lengths, strict=True)]


def _decoded(data: bytes) -> tuple[_Saved, int]:
    """A saved ledger's contents, checked whole, and the size of its whole record (with the
    magic before it); ValueError (or TypeError, KeyError, AttributeError, UnpackError) if any
    of it is not as `Ledger.save` writes it. A last record that does not check is one a save cut
    short: the ledger is taken as the save before it left it."""
    if not data.startswith(_MAGIC):
        raise ValueError("not a ledger this version writes")
    saved: _Saved | None = None
    moved: collections.Counter[str] = collections.Counter()  # refs, applied once: at the end
    at = whole = len(_MAGIC)
    view = memoryview(data)  # records read in place: a whole one is megabytes
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "little")
        body = view[at + _HEAD:at + _HEAD + size]
        if at + _HEAD + size > len(data) or \
                data[at + 4:at + _HEAD] != xxhash.xxh3_128_digest(body):
            if saved is None:
                raise ValueError("its digest does not match: it is torn or corrupt")
            saved.clean = False
            break
        saved = _applied(saved, cast(dict[str, object], unpack(body)), moved)
        at += _HEAD + size
        whole = whole if whole > len(_MAGIC) else at
    if saved is None:
        raise ValueError("it holds no record")
    saved.refs.change(moved)
    return saved, whole


def _applied(saved: _Saved | None, raw: dict[str, object],
             moved: collections.Counter[str]) -> _Saved:
    """The ledger `saved` with a record applied: the whole ledger first, then what each save
    since changed (how `refs` moved added to `moved`)."""
    if raw["whole"] is not (saved is None):
        raise ValueError("a record out of place")
    lists = [raw["sessions"], raw["removed"], raw["stamps"]]
    if not all(isinstance(found, list) for found in lists):
        raise ValueError("bad sessions")
    # stamps are only ever compared: a bad one reads its session again
    names, removed, stamps = cast(list[list[object]], lists)
    due = array("d")
    due.frombytes(cast(bytes, raw["due"]))
    if not all(map(valid_session, names)) or not all(map(valid_session, removed)) or \
            len(stamps) != 8 * len(names) or len(due) != len(names):
        raise ValueError("bad sessions")
    sessions = cast(list[str], names)
    held = _parts(raw["held"], len(sessions))
    protected = _parts(raw["protected"], len(sessions))
    ids, counts = cast(list[object], raw["refs"])
    if not isinstance(ids, bytes) or not isinstance(counts, bytes):
        raise ValueError("bad counts")
    damaged = cast(dict[object, object], raw["damaged"])
    found = {k: cast(list[object], raw[k]) for k in ("unthinned", "pending", "unsettled")}
    listed, kept, kept_bytes = raw["listed"], raw["kept"], raw["kept_bytes"]
    if not all(valid_session(s) and isinstance(why, str) for s, why in damaged.items()) or \
            not all(valid_session(s) for named in found.values() for s in named) or \
            not isinstance(listed, float) or not isinstance(kept, int) or \
            not isinstance(kept_bytes, int):
        raise ValueError("bad fields")
    unthinned, pending, unsettled = (set(cast(list[str], found[k]))
                                     for k in ("unthinned", "pending", "unsettled"))
    if saved is None:
        saved = _Saved({}, {}, {}, Counts(ids, counts), {}, set(), set(), set(), 0.0, 0, 0)
    else:
        deltas = array("i")
        deltas.frombytes(counts)
        if len(ids) != ID * len(deltas):
            raise ValueError("bad counts")
        moved.update({ids[at * ID:(at + 1) * ID].hex(): n for at, n in enumerate(deltas)})
        for session in [*cast(list[str], removed), *sessions]:
            for entries in (saved.stamps, saved.held, saved.thinnings):
                entries.pop(session, None)
    eights = cast(list[Stamp], zip(*[iter(stamps)] * 8, strict=True))
    saved.stamps.update(zip(sessions, eights, strict=True))
    saved.held.update((s, h) for s, h in zip(sessions, held, strict=True) if h)
    saved.thinnings.update(
        (s, history.Thinning([], d, frozenset(unpack_ids(p)) if p else frozenset()))
        for s, d, p in zip(sessions, due, protected, strict=True) if not math.isnan(d))
    saved.damaged, saved.unthinned, saved.pending, saved.unsettled = \
        cast(dict[str, str], damaged), unthinned, pending, unsettled
    saved.listed, saved.kept, saved.kept_bytes = listed, kept, kept_bytes
    return saved

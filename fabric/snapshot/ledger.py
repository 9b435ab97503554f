"""Retention and gc passes that cost what changed since the last one, not the whole store.

`history.retain` on every session and `history.gc` walk every session's history and list every
file; run after each commit on a store of 1,000 sessions, that is most of a server's time. A
`Ledger` keeps, for one store, what the last passes learned, and looks again only at

- the sessions whose head or index was written, or that were removed, since (in any process:
  the store marks them, `Store.take_changed`); at its first pass, every session;
- for retention, besides those, a session whose `due` time came (a version it kept leaves the
  policy's hours or days) or whose version kept only by protection lost it;
- for gc, the files that lost the last session holding them or that retention or removal
  released. It keeps what each session's history holds (`history.mark`) and how many sessions
  hold each file; at its first pass and every `grace` seconds after, it lists every file as
  `history.gc` does, for what no commit ever named (the writes of a save whose commit failed, a
  crash's leftovers): those are freed up to `grace` seconds later than a full pass would.

Of what retention and removal release, a pass frees exactly what `history.gc` would, under the
same rules (grace, touched since, saves in flight). The ledger lives in memory: a server that
starts builds it afresh at its first pass, reading each object's chunk list from the store's
`chunks` file rather than from its index.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

from ..errors import StoreError
from . import history
from .retention import RetentionPolicy
from .store import Store
from .tiers import valid_id

log = logging.getLogger(__name__)


class Ledger:
    def __init__(self, store: Store, grace: float = history.GRACE_SECONDS) -> None:
        self.store = store
        self.grace = grace
        self.held: dict[str, set[str]] = {}  # session -> the files its history holds
        self.refs: collections.Counter[str] = collections.Counter()  # file -> sessions holding it
        self.thinnings: dict[str, history.Thinning] = {}  # session -> its last retention
        self.damaged: dict[str, str] = {}  # session -> why its history cannot be read whole
        self.unthinned: set[str] = set()  # changed sessions retention has not looked at since
        self.pending: set[str] = set()  # and gc
        self.unsettled: set[str] = set()  # sessions whose releases wait for the next pass
        self.listed = -math.inf  # when a pass last listed every file
        self.kept = 0  # files and bytes kept: as last listed, since counted as they change
        self.kept_bytes = 0
        self._seen = False  # whether a pass has looked at every session

    def _changes(self) -> set[str]:
        """The sessions changed since the last call (every session at the first)."""
        changed = set(self.store.take_changed())  # first: a write meanwhile is seen next time
        if not self._seen:
            changed |= set(self.store.sessions())
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
        for session in sorted(self.unthinned | stale):
            self.unthinned.discard(session)  # a pass that fails leaves the rest for the next
            try:
                thinning = history.thin(self.store, session, policy, protect, now) \
                    if self.store.head(session) is not None else None
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
        dropped: set[str] = set()
        added: set[str] = set()
        holds = {s: self._holds(s, result.damaged) for s in sessions}
        if result.damaged:  # what they may still need: one read of every manifest for all
            kept: set[str] = set()
            history.keep_damaged(self.store, set(result.damaged), kept)
            for session in result.damaged:
                holds[session] |= kept
        for session, held in holds.items():
            gone, new = self._hold(session, held)
            dropped |= gone
            added |= new
        held = [s for s in sessions if s in self.held]
        freeable = history.released(self.store, held, result.damaged)
        if started - self.listed >= self.grace:
            self.listed = started
            history.sweep(self.store, self.refs, held, history.listing(self.store), freeable,
                          result, started, self.grace, saving_since)
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
        return result

    def _holds(self, session: str, damaged: dict[str, str]) -> set[str]:
        """What the session's history holds now (nothing, once removed); of a damaged one,
        added to `damaged` with why, what it could read."""
        holds: set[str] = set()
        try:
            if self.store.head(session) is not None:
                history.mark(self.store, session, holds)
        except StoreError as exc:
            damaged[session] = exc.message
        return holds

    def _hold(self, session: str, holds: set[str]) -> tuple[set[str], set[str]]:
        """Record that `session` holds `holds`: the files no session holds any more, and those
        no session held before."""
        before = self.held.pop(session, set())
        if holds:
            self.held[session] = holds
        dropped, added = set[str](), set[str]()
        for ident in before - holds:
            self.refs[ident] -= 1
            if not self.refs[ident]:
                del self.refs[ident]
                dropped.add(ident)
        for ident in holds - before:
            if not self.refs[ident]:
                added.add(ident)
            self.refs[ident] += 1
        return dropped, added

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

"""The store stays bounded: retention and gc, off the cell path.

After cells commit, and every `gc_interval` seconds besides (versions age out of the policy's
hours and days without any commit), a thread thins each session's history by the retention
policy and collects what that released: one pass at a time, and commits during a pass ask for
one more. Each store's `Ledger` keeps what the passes learned, so that a pass costs what changed
since the last one rather than the whole store, and saves it in the store, so that the first
pass after a restart costs what changed since it was saved. What open sessions build on (their
heads, what their drafts loaded) is never thinned. Past `disk_pressure` percent of the store's
disk, the operator is told (log and `status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path

from ..config import Config
from ..session import Session
from ..snapshot import Store
from ..snapshot.ledger import Ledger
from ..status import UpkeepStatus
from ..tasks import within

log = logging.getLogger(__name__)

UPKEEP_SHARE = 5  # retention and gc take at most a fifth of the host's time


class Upkeep:
    def __init__(self, config: Config, store: Store, stores: Callable[[], list[Store]],
                 sessions: Callable[[], Collection[Session]]) -> None:
        """`stores`: every store a pass thins; `sessions`: the open ones, whose bases stay."""
        self.config = config
        self.store = store
        self.stores = stores
        self.sessions = sessions
        self.wanted = asyncio.Event()  # a cell committed: retention and gc now
        self.pressure: float | None = None  # the disk's percent in use, while past its limit
        self.last: UpkeepStatus | None = None  # the latest pass, for `status`
        self.ledgers: dict[Path, Ledger] = {}  # by store root

    async def serve(self) -> None:
        """Retention and gc in a thread, when cells have committed and every `gc_interval`
        seconds; a pass that fails is logged and the next one tries again."""
        while True:
            with contextlib.suppress(TimeoutError):
                await within(self.wanted.wait(), self.config.gc_interval or None)
            self.wanted.clear()  # before the pass: a commit during it asks for another
            started = time.monotonic()
            try:
                self.last = await asyncio.to_thread(self.collect, self._protected(),
                                                    self._saving_since())
            except Exception:
                log.exception("retention and gc failed; the next commit or %d s retries",
                              self.config.gc_interval)
            # a pass holds the interpreter much of its time: commits in quick succession wait
            await asyncio.sleep((UPKEEP_SHARE - 1) * (time.monotonic() - started))

    def _protected(self) -> set[str]:
        """The versions open sessions build on: heads, and what prepared workers loaded."""
        sessions = self.sessions()
        ids = {s.head for s in sessions}
        ids |= {s.prepared.base for s in sessions if s.prepared is not None}
        return {i for i in ids if i}

    def _saving_since(self) -> float:
        """When the oldest save that may still commit began: the pass's own start, or the
        start of a cell running now, if earlier (`history.gc`)."""
        return min([time.time(), *(s.running_since for s in self.sessions()
                                   if s.running_since is not None)])

    def collect(self, protect: set[str], saving_since: float | None = None) -> UpkeepStatus:
        """One pass: thin every session's history, then free what that released (in the
        store, and in each user's part of it); `saving_since`: see `history.gc`."""
        started, thinned, removed, freed, kept = time.time(), 0, 0, 0, 0
        for store in self.stores():
            ledger = self.ledgers.get(store.root)
            if ledger is None:  # its store object kept too: it remembers the chunk lists read
                ledger = self.ledgers[store.root] = Ledger(store)
            thinned += ledger.retain(self.config.policy, protect)
            result = ledger.collect(saving_since)
            removed, freed = removed + result.removed, freed + result.freed
            kept += result.kept_bytes
        log.info("retention thinned %d versions; gc freed %d bytes in %d files", thinned,
                 freed, removed)
        return UpkeepStatus(started, time.time() - started, thinned, removed, freed, kept,
                            self.disk_percent(), self.pressure is not None)

    def disk_percent(self) -> float:
        usage = shutil.disk_usage(self.store.root)
        return 100.0 * (usage.total - usage.free) / usage.total

    def after_cell(self) -> None:
        """Ask for a retention and gc pass; past `disk_pressure` percent, tell the operator
        (the log, and `status`) once, until the disk is below it again."""
        self.wanted.set()
        percent = self.disk_percent()
        if not self.config.disk_pressure or percent < self.config.disk_pressure:
            self.pressure = None
        elif self.pressure is None:
            self.pressure = percent
            log.warning("the store's disk is %.0f%% full (disk_pressure = %d): retention and "
                        "gc run after every cell until it is below", percent,
                        self.config.disk_pressure)

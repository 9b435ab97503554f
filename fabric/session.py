"""One notebook session on this server: the order of its requests, and its head version.

The store holds the session; this object caches the head manifest, runs one cell at a time
(a checkout only between cells) and commits each cell's save as the session's next version.
What a host does for a cell (a worker readied while the user edits, the run under a lease, the
worker kept or retired after it, values that could not be saved rebuilt from their lineage) is
its host agent's (`pool.agent`), handed plain data: the cell, the head, and where events go.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from . import notices
from .closure import CellPlan, Closure, closure, plan
from .errors import SessionBusy, StoreError
from .pool import Leases, Pool
from .pool.agent import HostAgent
from .pool.cells import Cell, Done, Emit, Events, Head
from .pool.lifecycle import Keeper, Life
from .snapshot import Manifest, Store, history
from .snapshot.commit import CellRecord, commit, head_manifest


class Session:
    def __init__(self, name: str, cwd: str, store: Store, pool: Pool, leases: Leases,
                 keeper: Keeper, interrupt_grace: float = 5.0, gpus: int = 1) -> None:
        self.name = name
        self.gpus = gpus  # slots its cells lease together; a cell's execute may change it
        self.store = store
        self.agent = HostAgent(name, cwd, store, pool, leases, keeper, interrupt_grace)
        self.head = store.head(name)
        self.manifest = (Manifest.decode(store.get_manifest(self.head)) if self.head
                         else Manifest(session=name))
        self.lock = asyncio.Lock()
        self.opened = time.time()
        self.notices: deque[dict] = deque(maxlen=notices.KEEP)  # the latest, for `status`
        self._told: list[dict] = []  # the running cell's notices, for its reply
        # checks a version before it commits (the server's quotas): raises to refuse it
        self.admit: Callable[[Manifest], None] | None = None

    @property
    def prepared(self) -> Life | None:
        """The worker readied for the session's next cell, if any."""
        return self.agent.prepared

    def _events(self, emit: Emit | None) -> Events:
        return Events(self.name, emit, self._record)

    def _record(self, item: dict) -> None:
        self.notices.append(item)
        self._told.append(item)

    def _follow_head(self) -> Head:
        """Pick up a head moved outside this server (`llfabric store checkout`): the next cell
        runs on that version, and a worker prepared for the old head is no longer usable.
        The head is read again even if it has not moved: a cell never runs on a damaged one."""
        head = self.store.head(self.name)
        manifest = head_manifest(self.store, self.name, head)
        if head != self.head:
            self.manifest, self.head = manifest, head
        return Head(self.head, self.manifest)

    def checkout(self, version: int | str) -> dict:
        """Go back to `version`'s state: the next cell runs on it. The checkout is a new version,
        so history stays linear and the versions after `version` stay reachable."""
        if self.lock.locked():
            raise SessionBusy(f"session {self.name} is running a cell", session=self.name)
        manifest = history.checkout(self.store, self.name, version)
        self._follow_head()
        return {"version": manifest.version, "checked_out": manifest.cell["checkout"],
                "execution_count": int(manifest.cell.get("execution_count", 0))}

    def draft(self, source: str) -> dict:
        """Ready a worker for `source` now, while the user is still editing it."""
        head = self._follow_head()
        cl = closure(plan(source), self.manifest)
        self.agent.draft(cl, head, self._events(None))
        return self._describe(cl)

    def _describe(self, cl: Closure) -> dict:
        return {"names": sorted(cl.names), "groups": len(cl.groups), "whole": cl.whole,
                "exact": cl.exact, "session_variables": len(self.manifest.variables())}

    async def execute(self, source: str, emit: Emit, stdin: bool = False,
                      gpus: int | None = None, count: int | None = None) -> dict:
        """Run `source` as the session's next cell; with `gpus`, on that many slots from now
        on (refused before anything runs if the host cannot give them); with `count`, as the
        prompt number the frontend shows, else the one after the last cell's."""
        received = time.monotonic()
        if self.lock.locked():
            raise SessionBusy(f"session {self.name} is already running a cell", session=self.name)
        if gpus is not None:
            self.agent.leases.check(self.name, gpus)
            self.gpus = gpus
        async with self.lock:
            head = self._follow_head()
            cell = plan(source)
            cl = closure(cell, self.manifest)
            if count is None or count < 1:
                count = int(self.manifest.cell.get("execution_count", 0)) + 1
            self._told = []
            ran = await self.agent.run(Cell(cell, cl, count, stdin, received, self.gpus), head,
                                       self._events(emit),
                                       lambda done: self._commit(done, cell, count))
            return {"status": ran.status, "ename": ran.ename, "version": self.manifest.version,
                    "execution_count": count, "unsaved": ran.unsaved, "notices": self._told,
                    "path": ran.path, "source": ran.source, "closure": self._describe(cl),
                    "timings": ran.timings}

    def _commit(self, done: Done, cell: CellPlan, count: int) -> Head:
        """Fold the worker's save into a new version (`snapshot.commit`); the head moves to it."""
        if done.saved is None:
            raise StoreError("the worker ran the cell but sent no save report")
        self.head, self.manifest = commit(
            self.store, self.name, self.head, done.saved,
            CellRecord(cell.source, count, done.status, done.run, cell.modules), self.admit)
        return Head(self.head, self.manifest)

    def interrupt(self) -> bool:
        """KeyboardInterrupt in the running cell (see `HostAgent.interrupt`)."""
        return self.agent.interrupt()

    def stop(self, reason: str) -> None:
        self.agent.stop(reason)

    def answer(self, value: str | None, error: str | None) -> dict:
        """The client's answer to the running cell's input request."""
        return self.agent.answer(value, error)

    async def close(self) -> None:
        await self.agent.close()

    def status(self) -> dict:
        return {"session": self.name, "version": self.manifest.version, "head": self.head,
                "execution_count": int(self.manifest.cell.get("execution_count", 0)),
                "opened": self.opened, "gpus": self.gpus,
                "variables": len(self.manifest.variables()),
                "bytes": sum(g.size for g in self.manifest.groups),
                **self.agent.status(Head(self.head, self.manifest)),
                "notices": list(self.notices)}

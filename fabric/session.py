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
from .closure import Closure, closure
from .closure.groups import package_of
from .closure.static import analyze
from .errors import SessionBusy, StoreError
from .pool import Leases, Pool
from .pool.agent import Cell, Done, Emit, Events, Head, HostAgent
from .pool.lifecycle import Keeper, Life
from .snapshot import Group, Manifest, Store, history


class Session:
    def __init__(self, name: str, cwd: str, store: Store, pool: Pool, leases: Leases,
                 keeper: Keeper, interrupt_grace: float = 5.0) -> None:
        self.name = name
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
        manifest = self._head_manifest(head)
        if head != self.head:
            self.manifest, self.head = manifest, head
        return Head(self.head, self.manifest)

    def _head_manifest(self, head: str | None) -> Manifest:
        """The manifest `head` names, checked (hash, signature) as a new version's parent."""
        if head is None:
            return Manifest(session=self.name)
        try:
            return Manifest.decode(self.store.get_manifest(head))
        except StoreError as exc:
            raise StoreError(f"session {self.name}'s head is damaged ({exc.message}): no cell "
                             "can commit on it; `llfabric store verify` tells more",
                             session=self.name, head=head) from exc

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
        cl = closure(source, self.manifest)
        self.agent.draft(cl, head, self._events(None))
        return self._describe(cl)

    def _describe(self, cl: Closure) -> dict:
        return {"names": sorted(cl.names), "groups": len(cl.groups), "whole": cl.whole,
                "exact": cl.exact, "session_variables": len(self.manifest.variables())}

    async def execute(self, source: str, emit: Emit, stdin: bool = False) -> dict:
        received = time.monotonic()
        if self.lock.locked():
            raise SessionBusy(f"session {self.name} is already running a cell", session=self.name)
        async with self.lock:
            head = self._follow_head()
            cl = closure(source, self.manifest)
            count = int(self.manifest.cell.get("execution_count", 0)) + 1
            self._told = []
            ran = await self.agent.run(Cell(source, cl, count, stdin, received), head,
                                       self._events(emit),
                                       lambda done: self._commit(done, source, count))
            return {"status": ran.status, "ename": ran.ename, "version": self.manifest.version,
                    "execution_count": count, "unsaved": ran.unsaved, "notices": self._told,
                    "path": ran.path, "source": ran.source, "closure": self._describe(cl),
                    "timings": ran.timings}

    def _commit(self, done: Done, source: str, count: int) -> Head:
        """Fold the worker's save into a new manifest and move the head to it."""
        saved = done.saved
        if saved is None:
            raise StoreError("the worker ran the cell but sent no save report")
        owned = set(saved.owned) - set(saved.kept)  # kept: stay as committed
        new_groups = [Group(blob, tuple(names), size) for blob, names, size in saved.groups]
        for blob in [g.blob for g in new_groups] + [saved.ambient]:
            if not self.store.has(blob):  # a head must never point at missing data
                raise StoreError(f"the worker reported blob {blob!r} that is not in the store")
        self._head_manifest(self.head)  # a commit never builds on a damaged parent
        parent = self.manifest
        kept = [Group(g.blob, tuple(n for n in g.names if n not in owned), g.size)
                for g in parent.groups]
        manifest = Manifest(
            session=self.name,
            version=parent.version + 1,
            parent=self.head,
            groups=tuple(g for g in kept if g.names) + tuple(new_groups),
            imports={a: m for a, m in parent.imports.items() if a not in owned} | saved.imports,
            refs={n: r for n, r in parent.refs.items() if n not in owned}
            | {n: tuple(r) for n, r in saved.refs.items()},
            packages={n: p for n, p in parent.packages.items() if n not in owned}
            | {n: tuple(p) for n, p in saved.packages.items()},
            ambient=saved.ambient,
            modules=tuple(sorted(set(parent.modules) | {
                m for m in analyze(source).imports if package_of(m) is not None})),
            cell={"execution_count": count, "status": done.status, "source": source,
                  "time": time.time(), "unsaved": sorted(saved.unsaved),  # lineage, cold
                  "run": done.run},
        )
        if self.admit is not None:
            self.admit(manifest)
        ident = self.store.put_manifest(manifest.encode())
        self.store.set_head(self.name, ident, self.head)  # refused if the head moved
        self.head, self.manifest = ident, manifest
        return Head(ident, manifest)

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
                "opened": self.opened,
                "variables": len(self.manifest.variables()),
                "bytes": sum(g.size for g in self.manifest.groups),
                **self.agent.status(Head(self.head, self.manifest)),
                "notices": list(self.notices)}

"""One notebook session on this server: the order of its requests, and its head version.

The store holds the session; this object caches the head manifest, runs one cell at a time
(a checkout only between cells) and commits each cell's save as the session's next version (a
cell that changed nothing makes none: it is kept here, for the next cell's prompt number and the
kernel's history).
What a host does for a cell (a worker readied while the user edits, the run under a lease, the
worker kept or retired after it, values that could not be saved rebuilt from their lineage) falls
to its `pool.agent.SessionWorkers`, handed plain data: the cell, the head, and where events go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from . import notices
from .closure import CellPlan, Closure, closure, plan
from .envs import Env, differences
from .errors import SessionBusy, StaleHead, StoreError
from .messages import (
    CheckedOut,
    ClosureSummary,
    Completion,
    Delivered,
    Executed,
    InputAnswered,
    Inspection,
    Notice,
)
from .pool import Leases, Pool, debugging
from .pool.agent import SessionWorkers
from .pool.cells import Account, CellJob, Done, Emit, EventSink, Head
from .pool.lifecycle import CoolImage, Keeper, Life
from .protocol import Wire
from .snapshot import Manifest, Store, catalog, history
from .snapshot.commit import CellRecord, commit, head_manifest

log = logging.getLogger(__name__)

UNVERSIONED_KEPT = 1000  # of the cells that made no version, those the kernel's history shows


class Session:
    def __init__(self, name: str, cwd: str, store: Store, pool: Pool, leases: Leases,
                 keeper: Keeper, interrupt_grace: float = 5.0, gpus: int = 1,
                 env: Env | None = None, account: Account | None = None) -> None:
        self.name = name
        self.gpus = gpus  # slots its cells lease together; a cell's execute may change it
        self.store = store
        self.agent = SessionWorkers(name, cwd, store, pool, leases, keeper, interrupt_grace,
                                    account)
        self.agent.env = env
        self.head = store.head(name)
        self.manifest = (Manifest.decode(store.get_manifest(self.head)) if self.head
                         else Manifest(session=name))
        # the latest cells that made no version: the head each ran on, its prompt, its source
        self.unversioned: deque[tuple[str | None, int, str]] = deque(maxlen=UNVERSIONED_KEPT)
        self.started: str | None = None  # how its latest cell started (`cells.how_started`)
        self.lock = asyncio.Lock()
        self.opened = time.time()
        # when the running cell began (its save may reuse blobs retention releases meanwhile)
        self.running_since: float | None = None
        self.notices: deque[dict] = deque(maxlen=notices.KEEP)  # the latest, for `status`
        self._told: list[dict] = []  # the running cell's notices, for its reply
        # checks a version before it commits (the server's quotas): raises to refuse it
        self.admit: Callable[[Manifest], None] | None = None
        self._catalog: tuple[str | None, catalog.Catalog] = (None, catalog.EMPTY)

    @property
    def env(self) -> Env | None:
        """The environment its cells import from; None: the server's own packages."""
        return self.agent.env

    def use_env(self, env: Env | None) -> None:
        """Run the next cells in `env` (None: the server's packages)."""
        if self.lock.locked():
            raise SessionBusy(f"session {self.name} is running a cell", session=self.name)
        if env != self.env:
            self.agent.use_env(env)

    def _env_record(self) -> dict:
        """What a version records of its environment (`Manifest.env`)."""
        env = self.env
        return {} if env is None else {"name": env.name, "packages": env.packages()}

    @property
    def prepared(self) -> Life | None:
        """The worker readied for the session's next cell, if any."""
        return self.agent.prepared

    def _events(self, emit: Emit | None) -> EventSink:
        return EventSink(self.name, emit, self._record)

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

    def checkout(self, version: int | str) -> CheckedOut:
        """Go back to `version`'s state: the next cell runs on it. The checkout is a new version,
        so history stays linear and the versions after `version` stay reachable."""
        if self.lock.locked():
            raise SessionBusy(f"session {self.name} is running a cell", session=self.name)
        manifest = history.checkout(self.store, self.name, version)
        self._follow_head()
        now = self._env_record()
        return CheckedOut(manifest.version, manifest.cell["checkout"],
                          int(manifest.cell.get("execution_count", 0)), manifest.env.get("name"),
                          differences(manifest.env.get("packages", {}),
                                      now.get("packages", {})))

    def draft(self, source: str) -> ClosureSummary:
        """Ready a worker for `source` now, while the user is still editing it."""
        head = self._follow_head()
        cl = closure(plan(source), self.manifest)
        self.agent.draft(cl, head, self._events(None))
        return self._describe(cl)

    def _describe(self, cl: Closure) -> ClosureSummary:
        return ClosureSummary(tuple(sorted(cl.names)), len(cl.groups), len(cl.lazy), cl.whole,
                              cl.exact, len(self.manifest.variables()))

    async def execute(self, source: str, emit: Emit, stdin: bool = False,
                      gpus: int | None = None, count: int | None = None,
                      parent_id: str | None = None) -> Executed:
        """Run `source` as the session's next cell; with `gpus`, on that many slots from now
        on (refused before anything runs if the host cannot give them); with `count`, as the
        prompt number the frontend shows, else the one after the last cell's; `parent_id`:
        the frontend's request (`messages.Execute`)."""
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
                count = self.execution_count + 1
            self._told = []
            self.running_since = time.time()
            try:
                ran = await self.agent.run(CellJob(cell, cl, count, stdin, received, self.gpus,
                                                   parent_id),
                                           head, self._events(emit),
                                           lambda done: self._commit(done, cell, count))
            finally:
                self.running_since = None
            self.started = ran.start
            return Executed(ran.status, ran.ename, self.manifest.version, count,
                            tuple(ran.unsaved), tuple(Notice(**n) for n in self._told),
                            ran.path, ran.start, ran.source, self._describe(cl), ran.timings,
                            tuple(ran.payload), tuple(ran.unneeded))

    def _commit(self, done: Done, cell: CellPlan, count: int) -> Head:
        """Fold the worker's save into a new version (`snapshot.commit`); the head moves to it."""
        if done.saved is None:
            raise StoreError("the worker ran the cell but sent no save report")
        before = self.head
        try:
            self.head, self.manifest = commit(
                self.store, self.name, self.head, done.saved,
                CellRecord(cell.source, count, done.status, done.run, cell.modules,
                           self._env_record()), self.admit)
        except StaleHead as exc:  # committed elsewhere meanwhile: the next cell runs on that
            try:
                newest = self.store.adopt_head(self.name)
                version = Manifest.decode(self.store.get_manifest(newest)).version \
                    if newest else 0
                then = f"the session goes on from version {version}, the newest"
            except StoreError as unread:  # the next refusal tries again
                then = f"the newest version could not be read ({unread.message})"
            raise StaleHead(f"{exc.message}; this cell's work is not kept, and {then}",
                            **exc.fields) from exc
        if self.head == before:
            self.unversioned.append((before, count, cell.source))
        return Head(self.head, self.manifest)

    def history(self) -> list[tuple[int, str]]:
        """The session's cells, oldest first (`history.cells`), with those that made no version
        since it opened here, each after the version it ran on."""
        after: dict[str | None, list[tuple[int, str]]] = {}
        for base, count, source in self.unversioned:
            after.setdefault(base, []).append((count, source))
        return history.cells(self.store, self.name, after)

    @property
    def execution_count(self) -> int:
        """The prompt number of the session's latest cell, versioned or not."""
        if self.unversioned and self.unversioned[-1][0] == self.head:
            return self.unversioned[-1][1]
        return int(self.manifest.cell.get("execution_count", 0))

    # completion and inspection: the live worker's answer, else the head's catalog's
    async def complete(self, source: str, cursor: int) -> Completion:
        answer = await self.agent.questions.complete(source, cursor,
                                                     Head(self.head, self.manifest))
        if answer is not None and answer.get("matches"):
            return Completion.from_wire(answer)  # the worker's, checked
        return Completion.from_wire(
            catalog.complete(await asyncio.to_thread(self.catalog), source, cursor))

    async def inspect(self, source: str, cursor: int, detail: int) -> Inspection:
        answer = await self.agent.questions.inspect(source, cursor, 1 if detail else 0,
                                                    Head(self.head, self.manifest))
        if answer is not None and answer.get("found"):
            return Inspection.from_wire(answer)
        return Inspection.from_wire(
            catalog.inspect(await asyncio.to_thread(self.catalog), source, cursor))

    async def comm(self, msg_type: str, content: Wire, buffers: list[bytes], emit: Emit,
                   parent_id: str | None = None) -> Delivered:
        """A frontend's message to a comm of the session's live worker (a widget moved)."""
        delivered = await self.agent.questions.comm(msg_type, content, buffers,
                                                    Head(self.head, self.manifest),
                                                    self._events(emit), parent_id)
        return Delivered(delivered)

    async def debug(self, request: Wire) -> Wire:
        """A frontend's debug adapter request (`pool.debugging`); its response. The variables
        panel's list of the session's values comes from the head's catalog: between cells,
        they are in no process."""
        if request.get("command") == "inspectVariables":
            values = catalog.variables(await asyncio.to_thread(self.catalog))
            return debugging.response(request, {"variables": values})
        return await self.agent.debugger.request(request)

    def catalog(self) -> catalog.Catalog:
        """The head's catalog, read once per version; one that cannot be read is empty."""
        blob = self.manifest.catalog
        if blob != self._catalog[0]:
            entries = catalog.EMPTY
            if blob:
                try:
                    entries = catalog.decode(self.store.get(blob, catalog.LIMIT))
                except StoreError as exc:
                    log.warning("session %s: its catalog is not read: %s", self.name,
                                exc.message)
            self._catalog = (blob, entries)
        return self._catalog[1]

    def interrupt(self) -> bool:
        """KeyboardInterrupt in the running cell (see `SessionWorkers.interrupt`)."""
        return self.agent.interrupt()

    def stop(self, reason: str) -> None:
        self.agent.stop(reason)

    def answer(self, value: str | None, error: str | None) -> InputAnswered:
        """The client's answer to the running cell's input request."""
        return InputAnswered(**self.agent.answer(value, error))

    async def close(self) -> None:
        await self.agent.close()

    async def hand_over(self, wake_dir: str) -> tuple[CoolImage, Life] | None:
        """Dump the worker that alone holds unsaveable values, for another host (see
        `SessionWorkers.hand_over`); before the session closes here."""
        if self.lock.locked():
            raise SessionBusy(f"session {self.name} is running a cell: it moves after it",
                              session=self.name)
        return await self.agent.hand_over(wake_dir, Head(self.head, self.manifest))

    def arrive(self, life: Life) -> None:
        """Take another host's pinned worker, dumped at this session's head, as the next
        cell's."""
        self.agent.arrive(life)

    def status(self) -> Wire:
        return {"session": self.name, "version": self.manifest.version, "head": self.head,
                "execution_count": self.execution_count,
                "opened": self.opened, "gpus": self.gpus, "started": self.started,
                "env": self.env.name if self.env is not None else None,
                "variables": len(self.manifest.variables()),
                "bytes": sum(g.size for g in self.manifest.groups),
                **self.agent.status(Head(self.head, self.manifest)),
                "notices": list(self.notices)}

"""A session's workers: everything one host does for a session's cells.

A `Session` (ordering, its head) hands its `SessionWorkers` plain data: a cell (its source and
closure) and the head it runs on; that readies a worker for it (`draft`), runs it under a lease,
lets the session commit what it saved, then parks the worker for the next cell or retires it
(`run`), telling the client what happens as events. A worker kept for the next cell first lingers
on its lease (the leases' `linger` seconds): a next cell in that time starts on it as it is; when
the time is up, another session's cell waits for slots, or the worker is discarded, it lets go
(parked, then the lease given back; at once if discarded). A CPU slot that will not linger goes
back once the cell's state is only being written (`Flushing`). On one host the session calls it
directly; in a cluster each host has one, behind the same interface.

A worker readied for a head whose values are not all in the store (some could not be saved, and
the worker that held them is gone) rebuilds them from their lineage (`replay`) before its first
cell; if that is not safe, the user is told, in the cell, what is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, TypedDict, TypeGuard

from ..closure import Closure, closure, plan
from ..errors import (
    CellStopped,
    NotWaiting,
    ParkFailed,
    RemoteError,
    UnknownEnv,
    WorkerDied,
)
from ..snapshot import Group, Store, history, lineage
from ..snapshot import commit as durable
from ..worker.account import Account
from ..worker.messages import (
    Become,
    Loaded,
    Rehome,
    RunCell,
)
from .cells import CellJob, Commit, EventSink, Head, Ran, how_started
from .debugging import Debugger
from .leases import Lease, Leases
from .lifecycle import CoolImage, Keeper, Life, Stage
from .lingering import Lingering
from .loading import Lazy, StateLoader
from .pool import Pool, WorkerHandle
from .questions import Questions
from .replay import recompute
from .running import Running

if TYPE_CHECKING:
    from ..envs import Env

log = logging.getLogger(__name__)


class WorkerTier(TypedDict):
    """Where a session's state lives now, and its worker: its part of the session's status."""

    running: bool
    pinned: bool  # a worker kept alive for values that cannot be saved
    worker: int | None
    prepared: bool
    tier: str  # hot, warm, cool or cold
    memory: int  # bytes that tier holds
    lease_seconds: float


def _union(closures: list[Closure]) -> Closure:
    """What loading every closure of a chain of cells loads."""
    groups = {(g.blob, g.names): g for c in closures for g in c.groups}
    return Closure(frozenset().union(*(c.names for c in closures)), tuple(groups.values()),
                   {a: m for c in closures for a, m in c.imports.items()},
                   frozenset().union(*(c.modules for c in closures)),
                   any(c.whole for c in closures), all(c.exact for c in closures))


def _hold(life: Life, groups: list[Group], imports: dict[str, str]) -> None:
    """Record that `life`'s worker holds (or will, once loaded) `groups` and `imports`."""
    life.holds.update(n for g in groups for n in g.names)
    life.holds.update(imports)


def _split(cl: Closure, groups: list[Group], at_once: bool) -> tuple[list[Group], Lazy]:
    """`groups` (of `cl`) to load now, and those a cell run `at_once` loads when a branch needs
    them; a draft loads them all: the user is still editing."""
    lazy = tuple((g, reads) for g, reads in cl.lazy if g in groups) if at_once else ()
    later = {g for g, _ in lazy}
    return [g for g in groups if g not in later], lazy


class SessionWorkers:
    """One session's worker on this host, from its draft to its last cell."""

    def __init__(self, name: str, cwd: str, store: Store, pool: Pool, leases: Leases,
                 keeper: Keeper, interrupt_grace: float = 5.0,
                 account: Account | None = None) -> None:
        self.name, self.cwd, self.store = name, cwd, store
        self.account = account  # the OS user its workers become, on a host serving several
        self.pool, self.leases, self.keeper = pool, leases, keeper
        self.interrupt_grace = interrupt_grace
        self.prepared: Life | None = None  # the worker readied for the session's next cell
        self.running: Running | None = None  # the cell running now, until it commits
        self.interrupted = False
        self.busy = False  # a cell is between its request and its reply
        self.lost: list[str] = []  # unsaved names whose pinned worker died, not yet told
        self.lost_why = ""  # why they cannot be recomputed
        self.lost_at: str | None = None  # the head whose unsaved values the user knows are lost
        self.untold: list[tuple[str, str]] = []  # notices of between cells, told at the next
        self.env: Env | None = None  # the environment its workers import from; None: the server's
        self.debugger = Debugger()  # a frontend's debug session, across the cells' workers
        self.loader = StateLoader(name, cwd, store, leases)
        self.lingering = Lingering(name, pool, leases, keeper)  # kept workers' leases
        self.questions = Questions(name, keeper, self._between_cells)

    # readying a worker
    def draft(self, cl: Closure, head: Head, events: EventSink) -> None:
        """Ready a worker for a cell of closure `cl` on `head`, while the user edits it."""
        self._wake(self.prepared)
        if self._usable(self.prepared, head):
            self._extend(self.prepared, cl, events)
        else:
            self.prepared = self._replace(self.prepared, cl, head, events, running=self.busy)
        self.prepared.touch(drafted=True)  # its user edits the next cell: keep it longest

    def _prepare(self, cl: Closure, head: Head, events: EventSink,
                 replay: lineage.Replay | None = None, at_once: bool = False) -> Life:
        """A fresh worker for `cl` (`at_once`: for a cell that runs next, see `_split`); with
        `replay`, loaded with the state its chain starts from (the cell's own closure is loaded
        after the replay, see `replay.recompute`)."""
        start, needs = head.manifest, cl
        if replay is not None:
            start = replay.start
            needs = _union([closure(plan(str(c.get("source", ""))), start)
                            for c in replay.cells])
        groups, lazy = _split(needs, list(needs.groups), at_once and replay is None)

        async def make(life: Life) -> WorkerHandle:
            worker = await self.pool.new_worker(cl.modules | needs.modules,
                                                frozenset(head.manifest.modules), self.env,
                                                self.user)
            try:
                if self.account is not None:  # never deferred: before anything of the session
                    await self.loader.send(worker, Become(self.account), events)
                await self.loader.load_state(life, worker, groups, needs.imports, start, events,
                                             starting=replay is not None, lazy=lazy)
            except BaseException:
                await worker.close()
                raise
            life.loaded()
            return worker

        life = Life.start(self.pool, head.id, make)
        _hold(life, list(needs.groups), needs.imports)
        if replay is not None:  # what its cells bind, and what it is for, come from the replay
            life.replay = replay
            life.holds.update(n for c in replay.cells
                              for n in plan(str(c.get("source", ""))).analysis.writes)
            life.holds.update(replay.names)
            self._extend(life, cl, events)
        return life

    def _extend(self, life: Life, cl: Closure, events: EventSink, at_once: bool = False) -> bool:
        """Chain a load of what `cl` needs beyond what `life` holds (`at_once`: for a cell
        that runs next, see `_split`); False if nothing lacks."""
        lacking = [g for g in cl.groups if not life.holds.issuperset(g.names)]
        imports = {a: m for a, m in cl.imports.items() if a not in life.holds}
        if not lacking and not imports:
            return False
        # a worker still to replay loads the head's state after it, see `replay.recompute`
        defer = life.replay is not None
        groups, lazy = _split(cl, lacking, at_once and not defer)
        life.chain(lambda worker: self.loader.load_state(life, worker, groups, imports, None,
                                                         events, defer, lazy=lazy))
        _hold(life, lacking, imports)
        self.keeper.changed()
        return True

    def _usable(self, life: Life | None, head: Head) -> TypeGuard[Life]:
        if life is None or not life.usable(head.id):
            return False
        worker = life.worker()
        # a pinned worker alone holds what could not be saved: it stays, whatever changed
        return worker is None or bool(life.unsaved) or not self._env_changed(worker)

    def _env_changed(self, worker: WorkerHandle) -> bool:
        """Whether the session's environment changed since `worker` was made (it may hold
        modules imported before an install replaced them)."""
        try:
            return self.env is not None and self.pool.refresh(self.env) != worker.generation
        except UnknownEnv:  # removed: the next cell's fresh worker says so
            return True

    def use_env(self, env: Env | None) -> None:
        """Workers import from `env` (None: the server's packages) from the next cell on."""
        self.env = env
        life, self.prepared = self.prepared, None
        self._discard(life)

    def _discard(self, life: Life | None) -> None:
        if life is not None and life.lease is not None:  # the worker ends: nothing to park
            lease, life.lease = life.lease, None
            self.leases.release(lease)
        if life is not None and (closing := life.retire()) is not None:
            self.keeper.close_later(closing)
        self.keeper.changed()

    def _replace(self, life: Life | None, cl: Closure, head: Head, events: EventSink,
                 running: bool = False, at_once: bool = False) -> Life:
        """A fresh worker in place of one that is stale or gone: what only a worker held at
        the head (it died, or this server restarted) is recomputed where that is safe, else the
        user is told it is lost; not for a draft that comes while a cell is `running`: that
        cell's worker holds it."""
        self._discard(life)
        replay = None
        try:
            if not running and self.lost_at != head.id:
                replay = lineage.plan(self.store, head.manifest)
        except lineage.NotReplayable as exc:
            _, names = lineage.unsaved(self.store, head.manifest)
            self.lost.extend(n for n in names if n not in self.lost)
            self.lost_why = exc.message
        return self._prepare(cl, head, events, replay, at_once)

    def _wake(self, life: Life | None) -> TypeGuard[Life]:
        """Ask for a cool worker back, if `life` is one."""
        return life is not None and life.wake()

    # between cells: the worker `questions` asks
    def _between_cells(self, head: Head) -> Life | None:
        """The session's live worker, if no cell runs and it holds the head's state."""
        life = self._current()
        if self.busy or life is None or not self._usable(life, head) \
                or life.stage not in (Stage.READY, Stage.KEPT):
            return None
        return life

    # running a cell
    async def run(self, cell: CellJob, head: Head, events: EventSink, commit: Commit) -> Ran:
        """Run `cell` on the readied worker (or a fresh one) under a lease; `commit` folds its
        save into the session's next version, then the worker is kept or retired."""
        self.busy, self.interrupted = True, False
        try:
            life, self.prepared = self.prepared, None
            if self._wake(life):
                try:
                    await asyncio.shield(life.task)
                except ParkFailed as exc:  # unusable now: the cold path below tells
                    log.warning("session %s: %s", self.name, exc.message)
            lease = self.lingering.take(life, cell.slots)
            try:
                if life is not None and self._usable(life, head):
                    path = "pinned" if life.unsaved else "lingered" if lease else \
                        "warm" if life.kept else "draft"
                    path += "+load" if self._extend(life, cell.closure, events,
                                                    at_once=True) else ""
                else:  # a fresh worker takes the lease its old one lingered on, if any
                    life = self._replace(life, cell.closure, head, events, at_once=True)
                    path = "cold"
                self._tell_lost(events, head)
            except BaseException:
                self.lingering.give_back(lease)
                raise
            try:
                return await self._run_on(life, path, cell, head, events, commit, lease)
            except WorkerDied as exc:
                # nothing of the cell ran: one more worker, whatever ended this one (killed
                # from outside, its zygote gone); a second death is the cell's error
                if exc.fields.get("started"):
                    raise
                log.warning("session %s: its worker died before the cell began (%s); "
                            "starting it on a fresh one", self.name, exc.message)
                life = self._replace(life, cell.closure, head, events, at_once=True)
                self._tell_lost(events, head)
                return await self._run_on(life, "cold", cell, head, events, commit)
        finally:
            self.busy = False

    def _tell_lost(self, events: EventSink, head: Head) -> None:
        """Tell the user, in the cell, of values only a lost worker held that cannot be
        recomputed."""
        if not self.lost:
            return
        why = f"; they cannot be recomputed: {self.lost_why}" if self.lost_why else ""
        events.notice("lost", (
            f"the worker that held {', '.join(self.lost)} (which could not be saved) is gone; "
            f"continuing from version {head.manifest.version} of the store without them"
            f"{history.recompute_hint(self.store, self.name, self.lost)}{why}"), lost=True)
        self.lost, self.lost_why, self.lost_at = [], "", head.id

    async def _run_on(self, life: Life, path: str, cell: CellJob, head: Head, events: EventSink,
                      commit: Commit, lease: Lease | None = None) -> Ran:
        """Run the cell on `life`'s worker, on `lease` if it lingered for it, else on one it
        waits for; retire the worker after it unless it is kept."""
        replay, life.replay = life.replay, None
        path += "+replay" if replay is not None else ""
        try:
            worker = await life.task
        except BaseException:
            self.lingering.give_back(lease)
            raise
        for topic, text in self.untold:
            events.notice(topic, text)
        self.untold.clear()
        life.claim()
        kept = False
        try:
            ran, kept = await self._run(worker, life, lease, replay, path, cell, head, events,
                                        commit)
            return ran
        finally:
            if not kept:
                self.keeper.close_later(worker.close())

    async def _run(self, worker: WorkerHandle, life: Life, lease: Lease | None,
                   replay: lineage.Replay | None, path: str, cell: CellJob, head: Head,
                   events: EventSink, commit: Commit) -> tuple[Ran, bool]:
        """Run the cell under a lease (`lease`, lingering for it, else one it waits for) and
        commit; True with the result if the worker is kept."""
        queued = lease is None and self.leases.would_wait(self.name, cell.slots)
        if queued:  # the client tells the user why nothing happens yet
            events({"ahead": self.leases.queued, "slots": self.leases.slots}, "queued")
        waited = 0.0
        if lease is None:
            lease = await self.leases.acquire(self.name, cell.slots, prefer=worker.device)
            waited = lease.waited
        taken, lingers = lease.taken, False
        if queued:
            events({"waited": lease.waited}, "leased")
            events.notice("queued", f"waited {lease.waited:.1f} s for an execution slot")
        running = self.running = Running(self.name, worker, events, cell.stdin,
                                         self.interrupt_grace)
        if lease.device is None and self.leases.linger <= 0:
            # a CPU slot, kept for no next cell: it goes back once the cell's state is only
            # written (disk I/O needs no core), so that a queued cell starts meanwhile
            running.flushing = lambda: self.leases.release(lease)
        try:
            if self.interrupted:
                raise CellStopped("the cell was interrupted before it started",
                                  session=self.name, reason="interrupt")
            try:
                await self.pool.unpark(worker, lease.device)
            except ParkFailed as exc:
                await worker.close()
                raise WorkerDied(f"the kept worker could not be put back on the GPU "
                                 f"({exc.message})") from exc
            for message in life.starting:  # under the lease, before the replay it is for
                life.loading += await self.loader.send(
                    worker, replace(message, device=lease.device), events)
            life.starting.clear()
            if replay is not None:  # it settles on the head's groups afterwards
                await self.loader.fetch([*(g.blob for g in head.manifest.groups),
                                         head.manifest.ambient or ""])
                result = await recompute(worker, replay, head, life.holds, lease.device,
                                         lease.threads, events)
                if result.lost:
                    self.lost_at = head.id
                life.unsaved = result.rebuilt  # told of already: not again as pinned
            while life.deferred:  # under the lease, back on the GPU (and after a replay)
                life.loading += await self.loader.send(
                    worker, replace(life.deferred.pop(0), device=lease.device), events)
            reached = cell.plan.reached
            await self.debugger.join(worker, events)
            await worker.send(RunCell(cell.plan.source, cell.execution_count, lease.device,
                                      lease.threads,
                                      reached=None if reached is None else sorted(reached),
                                      save_limit=float(self.pool.save_limit),
                                      track_writes=self.pool.track_writes,
                                      parent_id=cell.parent_id))
            done = await running.relay()
            self.pool.learn_first_use(worker, done.first_use)
            if done.failed:  # its save failed: the worker, ahead of the store, goes
                raise RemoteError(done.failed)
            replicating = time.monotonic()
            if done.saved is not None and self.store.durable:  # durable there first
                await asyncio.to_thread(durable.replicate, self.store, self.name,
                                        head.manifest, done.saved)
            committed = time.monotonic()
            self.running = None  # the cell is over: no stop may kill it as it commits and parks
            head = await asyncio.to_thread(commit, done)  # the store's files: off the loop
            after = time.monotonic()
            saved = done.saved
            unsaved = sorted(saved.unsaved) if saved is not None else []
            # it lingers on the lease, unparked, or is parked before the lease goes back
            lingers = self.leases.linger > 0 and self._keepable(worker, unsaved)
            kept = lingers or await self._park(worker, unsaved, head, events, lease.device)
        except WorkerDied as exc:
            raise running.failed(exc, head.manifest.version) from exc
        finally:
            self.running = None
            running.end()
            await self.debugger.leave()
            ended = time.monotonic()
            if not lingers:
                self.leases.release(lease)
        if kept:
            self._keep(worker, head, set(saved.owned) if saved is not None else set(), unsaved,
                       life.rebuild or life.seconds + life.loading, lease if lingers else None)
        spreading = time.monotonic()
        if saved is not None and durable.spreads(self.store):  # off the lease, before its reply
            await self._spread(head, events)
        spread = time.monotonic() - spreading
        unsaved = unsaved if kept else []
        if unsaved and unsaved != life.unsaved and saved is not None:
            reasons = "; ".join(f"{n}: {why}" for n, why in saved.unsaved.items())
            events.notice("pinned", (
                f"{', '.join(unsaved)} cannot be saved ({reasons}); the session keeps its "
                "worker alive to hold them"))
        started = running.started if running.started is not None else cell.received
        return Ran(done.status, done.ename, unsaved, path, worker.source, {
            "prepare": life.seconds,
            "load": life.loading,
            "queue": waited,
            "visible_delay": max(0.0, started - cell.received),
            "run": done.run,
            "save": done.save + (after - committed),
            # with the linger before it, if it took one
            "lease_held": (lease.released or ended) - taken,
            "lazy_load": done.lazy,
            "replicate": committed - replicating + spread,
        }, how_started(path, life.restored), done.payload, done.unneeded), kept

    async def _spread(self, head: Head, events: EventSink) -> None:
        """Keep the new version on the other hosts a cluster without a remote tier asks for."""
        assert head.id is not None, "a commit makes a version"
        kept = await asyncio.to_thread(durable.spread, self.store, self.name, head.id)
        if kept.short:
            events.notice("copies", (
                f"version {head.manifest.version} is on {kept.held} of the {kept.copies} hosts "
                "asked for (`copies`): too few answered; a lost host may take it with it"))

    def answer(self, value: str | None, error: str | None) -> dict[str, bool]:
        """The client's answer to the running cell's input request."""
        if self.running is None:
            raise NotWaiting(f"no cell of session {self.name} is waiting for input",
                              session=self.name)
        return self.running.answer(value, error)

    # after a cell
    async def _park(self, worker: WorkerHandle, unsaved: list[str], head: Head, events: EventSink,
                    device: str | None) -> bool:
        """Take the worker off the GPU before its lease ends if it is to be kept: warm for the
        next cell, or pinned because it alone holds `unsaved`. False: it is retired; if parking
        failed, what only it held is lost and the session goes on from the store."""
        if not self._keepable(worker, unsaved):
            return False
        try:
            await self.pool.park(worker, device)
        except ParkFailed as exc:
            if not unsaved:  # the store holds all it had: the next cell starts fresh
                log.warning("session %s: retiring its warm worker: %s", self.name, exc.message)
                return False
            with contextlib.suppress(lineage.NotReplayable):
                lineage.plan(self.store, head.manifest)  # the next cell's worker rebuilds them
                events.notice("recompute", (
                    f"the worker could not be taken off the GPU ({exc.message}); "
                    f"{', '.join(unsaved)} (which could not be saved) will be recomputed"))
                return False
            self.lost_at = head.id
            events.notice("lost", (
                f"the worker could not be taken off the GPU ({exc.message}); "
                f"{', '.join(unsaved)} (which could not be saved) are lost, the session goes "
                f"on from version {head.manifest.version}"), lost=True)
            return False
        return True

    def _keepable(self, worker: WorkerHandle, unsaved: list[str]) -> bool:
        """Whether the worker is kept after its cell: pinned, or warm unless the session's
        environment changed (an install in the cell: the next worker imports what it
        installed)."""
        return bool(unsaved) or (bool(self.pool.keep_warm) and not self._env_changed(worker))

    def _keep(self, worker: WorkerHandle, head: Head, owned: set[str], unsaved: list[str],
              rebuild: float, lease: Lease | None = None) -> None:
        """Keep the worker as the session's next: it holds the state the head names, so the
        next cell needs no load (and, pinned, it alone holds what could not be saved); with
        `lease`, lingering on it (parked already otherwise). `rebuild`: the seconds a fresh
        worker took to ready the session's state."""
        self._discard(self.prepared)  # a draft sent while the cell ran was made for the old head
        life = self.prepared = Life.after_cell(self.pool, worker, head.id, owned, unsaved,
                                               rebuild)
        if lease is None:
            self.keeper.keep(life)
            return
        self.lingering.start(life, worker, lease)

    # moving to another host
    async def hand_over(self, wake_dir: str, head: Head) -> tuple[CoolImage, Life] | None:
        """Dump the worker that alone holds values at `head` that could not be saved, for the
        server that wakes restored workers in `wake_dir`, with its life (what it holds); None
        when there is no such worker. ParkFailed: it could not be dumped, and is gone."""
        life = self._current()
        if life is None or not life.unsaved or not self._usable(life, head):
            return None
        self.lingering.let_go(life)  # parked before it is dumped
        self.prepared = None
        self.keeper.changed()
        return await life.hand_over(wake_dir), life

    def arrive(self, life: Life) -> None:
        """Take `life`, another host's pinned worker, as the worker for the next cell: once
        restored, it uses this host's store."""
        self._discard(self.prepared)

        async def rehome(worker: WorkerHandle) -> None:
            await worker.send(Rehome(str(self.store.root), self.cwd))
            if not isinstance(reply := await worker.recv(), Loaded):
                raise WorkerDied(f"worker {worker.pid} answered rehome with {reply.op!r}")
            if reply.error:  # its cells run on all the same, told at the next one
                self.untold.append(("directory", reply.error))

        life.chain(rehome, prepares=False)
        self.prepared = life

    @property
    def user(self) -> str:
        """Whose cells these are: the user a store name is prefixed with ("": the server's)."""
        user, prefixed, _ = self.name.partition("~")
        return user if prefixed else ""

    # stopping
    def interrupt(self) -> bool:
        """KeyboardInterrupt in the running cell (see `running`); a cell still waiting for its
        worker or lease never starts."""
        if self.running is not None:
            self.running.interrupt()
            return True
        if self.busy:
            self.interrupted = True
            return True
        return False

    def stop(self, reason: str) -> None:
        """Stop the running cell now (`reason`, a key of `running.STOPS`): kill the worker
        running it, or make sure a cell still waiting for its worker or lease never starts."""
        self.interrupted = self.busy
        if self.running is not None:
            self.running.stop(reason)

    async def close(self) -> None:
        self.stop("close")
        life, self.prepared = self.prepared, None
        self._discard(life)  # its lease is given back: no linger is left to end
        await self.lingering.close()

    # what it holds
    def _current(self) -> Life | None:
        if self.prepared is not None and self.prepared.stage is Stage.RETIRED:
            self.prepared = None  # the keeper retired it
        return self.prepared

    def worker_pid(self) -> int | None:
        """The worker running a cell, else the one prepared for the next, once it is forked."""
        if self.running is not None:
            return self.running.worker.pid
        life = self._current()
        worker = life.worker() if life is not None else None
        return worker.pid if worker is not None else None

    def status(self, head: Head) -> WorkerTier:
        """hot (running a cell), warm (a live worker kept), cool (on disk) or cold (store only),
        the bytes that tier holds, and the worker."""
        life = self._current()
        tier, memory = "cold", 0
        if self.running is not None:
            tier, memory = "hot", self.pool.memory(self.running.worker)
        elif life is not None and life.cooled is not None:
            tier, memory = "cool", life.cooled.size
        elif life is not None and (worker := life.worker()) is not None:
            tier, memory = "warm", self.pool.memory(worker)
        return {"running": self.running is not None,
                "pinned": bool(life and life.unsaved and self._usable(life, head)),
                "worker": self.worker_pid(),
                "prepared": life is not None,
                "tier": tier, "memory": memory,
                "lease_seconds": self.leases.seconds_of(self.name)}

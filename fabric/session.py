"""One notebook session on this server: its head version, its draft worker, its running cell.

The store holds the session; this object only caches the head manifest and owns the processes
working for it. A cell runs as: closure -> worker (the session's warm one, prepared by a draft,
or forked now) -> lease -> run -> save -> commit -> park -> release. The worker stays warm for
the next cell (`keep_warm` seconds; pinned while it alone holds state that could not be saved).
When a fresh worker must take over such state, it is rebuilt from its lineage where that is safe
(`snapshot.lineage`): the worker loads the version the producing cells ran on, runs them again
under the cell's lease, then settles on the head; only otherwise is the user told of a loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field

from . import notices
from .closure import Closure, closure
from .errors import CellStopped, FabricError, RemoteError, SessionBusy, WorkerDied
from .plan import plan
from .pool import Leases, Pool, WorkerHandle, parking
from .pool.parking import CoolImage
from .snapshot import Group, Manifest, Store, history, lineage
from .snapshot.commit import commit, head_manifest

log = logging.getLogger(__name__)

Emit = Callable[..., None]  # emit(payload, event="output"): an event of the running request


class LoadFailed(FabricError):
    """The worker could not rebuild the closure from the store."""

    kind = "load"


@dataclass
class Preparation:
    """A worker being readied for cells: forked, imports done, closure loaded (into a parked
    worker only once its cell's lease has put it back on the GPU: see `Session._load`).

    `holds` names what the worker has (or will have, once `task` completes): loaded variables
    and aliases, or, for a worker kept after its cell, everything it owns. A later draft with
    other source chains a load of what it lacks onto the task.
    """

    base: str | None  # the head manifest the worker's state matches
    task: asyncio.Future
    holds: set[str] = field(default_factory=set)
    kept: bool = False  # the worker of the session's last cell, kept after it
    unsaved: list[str] = field(default_factory=list)  # kept: what only it holds
    started: float = field(default_factory=time.monotonic)
    touched: float = field(default_factory=time.monotonic)  # its last draft: idle since then
    ready_at: float | None = None
    cooled: CoolImage | None = None  # the kept worker, dumped to disk until `demand` is set
    demand: asyncio.Event | None = None
    replay: lineage.Replay | None = None  # to run under the cell's lease, before the cell

    @property
    def seconds(self) -> float:
        return (self.ready_at or time.monotonic()) - self.started

    def lacking(self, cl: Closure) -> tuple[list[Group], dict[str, str]]:
        groups = [g for g in cl.groups if not self.holds.issuperset(g.names)]
        imports = {a: m for a, m in cl.imports.items() if a not in self.holds}
        return groups, imports

    def add(self, groups: list[Group], imports: dict[str, str]) -> None:
        self.holds.update(n for g in groups for n in g.names)
        self.holds.update(imports)


REPLAY_SHOWN = 500  # characters of a replay's outputs its notice repeats


def _union(closures: list[Closure]) -> Closure:
    """What loading every closure of a chain of cells loads."""
    groups = {(g.blob, g.names): g for c in closures for g in c.groups}
    return Closure(frozenset().union(*(c.names for c in closures)), tuple(groups.values()),
                   {a: m for c in closures for a, m in c.imports.items()},
                   frozenset().union(*(c.modules for c in closures)),
                   any(c.whole for c in closures), all(c.exact for c in closures))


def _text(output: dict) -> str:
    """An output as the text a notice can repeat."""
    if output.get("output_type") == "stream":
        return str(output.get("text", ""))
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}\n"
    return str((output.get("data") or {}).get("text/plain", ""))


STOPS = {  # why the server stopped a running cell, as the user is told
    "interrupt": "the cell did not stop within {grace:g} s of its interrupt",
    "close": "the session was closed while the cell ran",
    "client": "the client that ran the cell stopped answering",
}


class Session:
    def __init__(self, name: str, cwd: str, store: Store, pool: Pool, leases: Leases,
                 interrupt_grace: float = 5.0) -> None:
        self.name = name
        self.cwd = cwd
        self.store = store
        self.pool = pool
        self.leases = leases
        self.head = store.head(name)
        self.manifest = (Manifest.decode(store.get_manifest(self.head)) if self.head
                         else Manifest(session=name))
        self.lock = asyncio.Lock()
        self.prepared: Preparation | None = None
        self.running: WorkerHandle | None = None
        self.interrupted = False
        self.interrupt_grace = interrupt_grace
        self._escalation: asyncio.TimerHandle | None = None  # the kill an interrupt schedules
        self._stopped: str | None = None  # why the running cell's worker was killed
        self._saving = False  # the running cell's code has ended; its worker saves
        self.opened = time.time()
        self._answer: asyncio.Future | None = None  # the client's answer to the cell's input()
        self.lost: list[str] = []  # unsaved names whose pinned worker died, not yet told
        self.lost_why = ""  # why they cannot be recomputed
        self.lost_at: str | None = None  # the head whose unsaved values the user knows are lost
        self.notices: deque[dict] = deque(maxlen=notices.KEEP)  # the latest, for `status`
        self._told: list[dict] = []  # the running cell's notices, for its reply
        self._background: set[asyncio.Task] = set()
        # checks a version before it commits (the server's quotas): raises to refuse it
        self.admit: Callable[[Manifest], None] | None = None

    # preparation
    def _prepare(self, cl: Closure, replay: lineage.Replay | None = None) -> Preparation:
        """A fresh worker for `cl`; with `replay`, loaded with the state its chain starts from
        (the cell's own closure is loaded after the replay, see `_recompute`)."""
        start, needs = self.manifest, cl
        if replay is not None:
            start = replay.start
            needs = _union([closure(plan(str(c.get("source", ""))), start)
                            for c in replay.cells])

        async def prepare() -> WorkerHandle:
            worker = await self.pool.new_worker(cl.modules | needs.modules,
                                                frozenset(self.manifest.modules))
            try:
                await self._load(worker, list(needs.groups), needs.imports, first=True,
                                 start=start)
            except BaseException:
                await worker.close()
                raise
            prep.ready_at = time.monotonic()
            return worker

        prep = Preparation(self.head, asyncio.ensure_future(prepare()), replay=replay)
        prep.add(list(needs.groups), needs.imports)
        if replay is not None:  # what its cells bind, and what it is for, come from the replay
            prep.holds.update(n for c in replay.cells
                              for n in plan(str(c.get("source", ""))).analysis.writes)
            prep.holds.update(replay.names)
            self._extend(prep, cl)
        return prep

    def _extend(self, prep: Preparation, cl: Closure) -> bool:
        """Chain a load of what `cl` needs beyond what `prep` holds; False if nothing lacks."""
        groups, imports = prep.lacking(cl)
        if not groups and not imports:
            return False
        previous = prep.task
        prep.touched = time.monotonic()

        async def extend() -> WorkerHandle:
            worker = await previous
            try:  # a worker still to replay loads the head's state after it, see `_recompute`
                await self._load(worker, groups, imports, defer=prep.replay is not None)
            except BaseException:
                await worker.close()
                raise
            prep.ready_at = time.monotonic()
            return worker

        prep.task = asyncio.ensure_future(extend())
        prep.add(groups, imports)
        return True

    async def _load(self, worker: WorkerHandle, groups: list[Group], imports: dict[str, str],
                    first: bool = False, start: Manifest | None = None,
                    defer: bool = False) -> None:
        message = {"op": "load", "groups": [[g.blob, list(g.names)] for g in groups],
                   "imports": imports}
        if first:
            message |= {"cwd": self.cwd, "ambient": (start or self.manifest).ambient}
        if worker.parked or defer:  # a parked one's CUDA calls would block until the lease
            # unparks it: load then
            worker.deferred.append(message)
            return
        await self._send_load(worker, message)

    async def _send_load(self, worker: WorkerHandle, message: dict) -> None:
        await worker.send(message)
        reply = await worker.recv()
        while reply.get("op") == "notice":  # a long load's progress, before any cell runs
            self._notify(None, str(reply.get("topic", "")), str(reply.get("text", "")))
            reply = await worker.recv()
        if reply.get("error"):
            raise LoadFailed(f"could not load the session's state: {reply['error']}",
                             session=self.name, version=self.manifest.version,
                             traceback=reply.get("traceback", ""))

    def _usable(self, prep: Preparation | None) -> bool:
        if prep is None or prep.base != self.head:
            return False
        if not prep.task.done():
            return True
        return not (prep.task.cancelled() or prep.task.exception()
                    or prep.task.result().died.done())

    def _spawn(self, coro: Coroutine) -> None:
        """Run clean-up in the background, holding a reference so it is not collected."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _discard(self, prep: Preparation | None) -> None:
        if prep is None:
            return
        if prep.demand is not None and not prep.demand.is_set():
            prep.task.cancel()  # a cool worker nobody needs: drop its image, never restore it
            return

        async def retire() -> None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                worker = await prep.task
                await worker.close()

        self._spawn(retire())

    def _follow_head(self) -> None:
        """Pick up a head moved outside this server (`llfabric store checkout`): the next cell
        runs on that version, and a worker prepared for the old head is no longer usable.
        The head is read again even if it has not moved: a cell never runs on a damaged one."""
        head = self.store.head(self.name)
        manifest = head_manifest(self.store, self.name, head)
        if head != self.head:
            self.manifest, self.head = manifest, head

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
        """Prepare a worker for `source` now, while the user is still editing it."""
        self._follow_head()
        cl = closure(plan(source), self.manifest)
        self._thaw(self.prepared)
        if self._usable(self.prepared):
            self._extend(self.prepared, cl)
        else:
            self.prepared = self._replace(self.prepared, cl)
        return self._describe(cl)

    def _replace(self, prep: Preparation | None, cl: Closure) -> Preparation:
        """A fresh preparation in place of one that is stale or whose worker is gone: what
        only a worker held at the head (it died, or this server restarted) is recomputed where
        that is safe, else the user is told it is lost."""
        self._discard(prep)
        replay = None
        try:
            if self.lost_at != self.head:
                replay = lineage.plan(self.store, self.manifest)
        except lineage.NotReplayable as exc:
            _, names = lineage.unsaved(self.store, self.manifest)
            self.lost.extend(n for n in names if n not in self.lost)
            self.lost_why = exc.message
        return self._prepare(cl, replay)

    def _describe(self, cl: Closure) -> dict:
        return {"names": sorted(cl.names), "groups": len(cl.groups), "whole": cl.whole,
                "exact": cl.exact, "session_variables": len(self.manifest.variables())}

    # execution
    async def execute(self, source: str, emit: Emit, stdin: bool = False) -> dict:
        received = time.monotonic()
        if self.lock.locked():
            raise SessionBusy(f"session {self.name} is already running a cell", session=self.name)
        async with self.lock:
            self.interrupted = False
            self._follow_head()
            cl = closure(plan(source), self.manifest)
            prep, self.prepared = self.prepared, None
            if self._thaw(prep):
                try:
                    await asyncio.shield(prep.task)
                except parking.ParkFailed as exc:  # unusable now: the cold path below tells
                    log.warning("session %s: %s", self.name, exc.message)
            if self._usable(prep):
                path = "pinned" if prep.unsaved else "warm" if prep.kept else "draft"
                path += "+load" if self._extend(prep, cl) else ""
            else:
                prep, path = self._replace(prep, cl), "cold"
            self._told = []
            self._tell_lost(emit)
            run = (source, emit, received, cl, stdin)
            try:
                return await self._run_on(prep, self._path(path, prep), *run)
            except WorkerDied as exc:
                if exc.fields.get("started") or not prep.kept:
                    raise
                log.warning("session %s: its kept worker died before the cell began (%s); "
                            "starting it on a fresh one", self.name, exc.message)
                prep = self._replace(prep, cl)
                self._tell_lost(emit)
                return await self._run_on(prep, self._path("cold", prep), *run)

    @staticmethod
    def _path(path: str, prep: Preparation) -> str:
        return path + ("+replay" if prep.replay is not None else "")

    def _tell_lost(self, emit: Emit) -> None:
        """Tell the user, in the cell, of values only a lost worker held that cannot be
        recomputed."""
        if not self.lost:
            return
        why = f"; they cannot be recomputed: {self.lost_why}" if self.lost_why else ""
        self._notify(emit, "lost", (
            f"the worker that held {', '.join(self.lost)} (which could not be saved) is gone; "
            f"continuing from version {self.manifest.version} of the store without them"
            f"{history.recompute_hint(self.store, self.name, self.lost)}{why}"), lost=True)
        self.lost, self.lost_why, self.lost_at = [], "", self.head

    async def _run_on(self, prep: Preparation, path: str, source: str, emit: Emit,
                      received: float, cl: Closure, stdin: bool) -> dict:
        """Run the cell on `prep`'s worker; retire the worker after it unless it is kept."""
        worker = await prep.task
        keep = False
        try:
            reply, keep = await self._run(worker, source, emit, received, prep, cl, path, stdin)
            return reply
        finally:
            if not keep:
                self._spawn(worker.close())

    async def _run(self, worker: WorkerHandle, source: str, emit: Emit, received: float,
                   prep: Preparation, cl: Closure, path: str, stdin: bool) -> tuple[dict, bool]:
        """Run the cell under a lease and commit; True with the reply if the worker is kept."""
        queued = self.leases.queued > 0 or len(self.leases.held) >= self.leases.slots
        if queued:  # the client tells the user why nothing happens yet
            emit({"ahead": self.leases.queued, "slots": self.leases.slots}, "queued")
        lease = await self.leases.acquire(self.name, prefer=worker.device)
        if queued:
            emit({"waited": lease.waited}, "leased")
            self._notify(emit, "queued", f"waited {lease.waited:.1f} s for an execution slot")
        self.running, began = worker, False
        self._stopped, self._saving = None, False
        try:
            if self.interrupted:
                raise FabricError("the cell was interrupted before it started", session=self.name)
            try:
                await self.pool.unpark(worker, lease.device)
            except parking.ParkFailed as exc:
                await worker.close()
                raise WorkerDied(f"the kept worker could not be put back on the GPU "
                                 f"({exc.message})") from exc
            if prep.replay is not None:
                await self._recompute(worker, prep, lease.device, emit)
            while worker.deferred:  # under the lease, back on the GPU (and after a replay)
                await self._send_load(worker, worker.deferred.pop(0))
            count = int(self.manifest.cell.get("execution_count", 0)) + 1
            await worker.send({"op": "run", "source": source, "execution_count": count,
                               "device": lease.device, "threads": self.leases.threads})
            started = received
            while True:
                message = await worker.recv()
                op = message.get("op")
                if op == "output":
                    emit(message["output"])
                elif op == "notice":
                    self._notify(emit, str(message.get("topic", "")),
                                 str(message.get("text", "")))
                elif op == "started":
                    started, began = float(message["t"]), True
                elif op == "saving":
                    self._saving = True
                elif op == "input":
                    answer = await self._ask(worker, message, emit, stdin)
                    if answer is not None:  # None: interrupted; the worker stopped waiting
                        await worker.send(answer)
                elif op == "done":
                    break
            if message.get("failed"):  # its save failed: the worker, ahead of the store, goes
                raise RemoteError(message["failed"])
            committed = time.monotonic()
            self._commit(message, source, count)
            self.running = None  # committed, the cell is over: no stop may kill it while it parks
            done = time.monotonic()
            unsaved = sorted(message.get("unsaved") or {})
            kept = await self._park(worker, unsaved, emit, lease.device)
        except WorkerDied as exc:
            if self._stopped is not None:
                why = STOPS[self._stopped].format(grace=self.interrupt_grace)
                raise CellStopped(f"{why}: its worker was killed and the session stays at "
                                  f"version {self.manifest.version}", session=self.name,
                                  version=self.manifest.version, reason=self._stopped) from exc
            raise WorkerDied(f"{exc.message}; the session stays at version "
                             f"{self.manifest.version}", session=self.name,
                             version=self.manifest.version, started=began) from exc
        finally:
            self.running = None
            if self._escalation is not None:
                self._escalation.cancel()
                self._escalation = None
            self.leases.release(lease)
        unsaved = unsaved if kept else []
        if unsaved and unsaved != prep.unsaved:
            reasons = "; ".join(f"{n}: {why}" for n, why in message["unsaved"].items())
            self._notify(emit, "pinned", (
                f"{', '.join(unsaved)} cannot be saved ({reasons}); the session keeps its "
                "worker alive to hold them"))
        if kept:
            self._keep(worker, set(message["owned"]), unsaved)
        return {
            "status": message["status"],
            "ename": message.get("ename"),
            "version": self.manifest.version,
            "execution_count": count,
            "unsaved": unsaved,
            "notices": self._told,
            "path": path,
            "source": worker.source,
            "closure": self._describe(cl),
            "timings": {
                "prepare": prep.seconds,
                "queue": lease.waited,
                "visible_delay": max(0.0, started - received),
                "run": float(message["run"]),
                "save": float(message["save"]) + (done - committed),
                "lease_held": lease.held,
            },
        }, kept

    async def _recompute(self, worker: WorkerHandle, prep: Preparation, device: str | None,
                         emit: Emit) -> None:
        """Rebuild what `prep.replay` is for on `worker` (loaded with the state its chain starts
        from) by running the chain again, its outputs told in a notice, then settle the worker
        on the head: every name `prep` claims to hold is then the head's."""
        replay, prep.replay = prep.replay, None
        assert replay is not None
        began, printed, failed = time.monotonic(), [], ""
        shown = began
        for cell in replay.cells:
            count = int(cell.get("execution_count") or 0)
            self._notify(emit, "progress", f"recomputing {', '.join(replay.names)}: re-running "
                         f"cell {count}")  # the client sees the cell is not stuck
            await worker.send({"op": "run", "source": str(cell.get("source", "")), "replay": True,
                               "execution_count": count, "device": device,
                               "threads": self.leases.threads})
            while (message := await worker.recv()).get("op") != "done":
                if message.get("op") == "output":
                    printed.append(_text(message["output"]))
                    if time.monotonic() - shown > 1:
                        self._notify(emit, "progress", f"recomputing {', '.join(replay.names)}: "
                                     f"cell {count} runs again")
                        shown = time.monotonic()
                elif message.get("op") == "input":
                    await worker.send({"op": "input_reply", "error": "a replayed cell asks no one"})
            if message.get("status") != cell.get("status", "ok"):
                failed = (f"cell {count} ended with {message.get('ename') or 'an error'} this "
                          f"time, not as it first did")
                break
        head, head_id = self.manifest, self.head
        await worker.send({
            "op": "settle", "groups": [[g.blob, list(g.names)] for g in head.groups],
            "imports": head.imports, "ambient": head.ambient,
            "keep": [] if failed else replay.names,
            "want": sorted(prep.holds & head.names())})
        settled = await worker.recv()
        if settled.get("error"):
            raise LoadFailed(f"could not settle on the session's state after recomputing "
                             f"{', '.join(replay.names)}: {settled['error']}", session=self.name,
                             version=head.version, traceback=settled.get("traceback", ""))
        lost = replay.names if failed else sorted({*settled.get("dropped", ()),
                                                   *settled.get("missing", ())})
        if settled.get("dropped"):
            failed = (f"running the cells again gave {', '.join(settled['diverged'])}, which "
                      f"{', '.join(settled['dropped'])} share objects with, other values than "
                      "they first did")
        cells = ", ".join(str(c.get("execution_count", "?")) for c in replay.cells)
        if lost:
            self.lost_at = head_id
            self._notify(emit, "lost", (
                f"the worker that held {', '.join(lost)} (which could not be saved) is gone, and "
                f"re-running cell{'s' if len(replay.cells) > 1 else ''} {cells} did not rebuild "
                f"them{': ' + failed if failed else ''}; continuing from version {head.version} "
                "without them"), lost=True)
        if rebuilt := [n for n in replay.names if n not in lost]:
            prep.unsaved = rebuilt  # the user was told of them already: not again as pinned
            said = "".join(printed).strip()
            self._notify(emit, "recomputed", (
                f"{', '.join(rebuilt)} (which could not be saved) were rebuilt on a fresh worker "
                f"by re-running cell{'s' if len(replay.cells) > 1 else ''} {cells} from version "
                f"{replay.start.version} in {time.monotonic() - began:.2f} s"
                + (f"; they printed: {said[:REPLAY_SHOWN]}" if said else "")))

    def _notify(self, emit: Emit | None, topic: str, text: str, lost: bool = False) -> None:
        """Tell the client what llfabric did, outside the cell's outputs (see `notices`); a
        `lost` notice also shows in the cell, as an error. Progress is shown, not kept."""
        item = notices.notice(topic, text)
        log.info("session %s: %s", self.name, text)
        if topic != "progress":
            self.notices.append(item)
            self._told.append(item)
        if emit is not None:
            emit(item, "notice")
            if lost:
                emit(notices.loss(text))

    async def _ask(self, worker: WorkerHandle, request: dict, emit: Emit,
                   stdin: bool) -> dict | None:
        """Relay the cell's input() to the client; its answer, or None if the cell was
        interrupted or its worker died first."""
        if not stdin:
            return {"op": "input_reply", "error": "input() was called, but the client that "
                    "runs this cell does not answer input requests"}
        self._answer = asyncio.get_running_loop().create_future()
        emit({"prompt": str(request.get("prompt", "")),
              "password": bool(request.get("password"))}, "input_request")
        try:
            await asyncio.wait({self._answer, worker.died}, return_when=asyncio.FIRST_COMPLETED)
            answer = self._answer.result() if self._answer.done() else None
        finally:
            self._answer = None
        return None if answer is None else {"op": "input_reply", **answer}

    def answer(self, value: str | None, error: str | None) -> dict:
        """The client's answer to the running cell's input request."""
        if self._answer is None or self._answer.done():
            raise FabricError(f"no cell of session {self.name} is waiting for input",
                              session=self.name)
        self._answer.set_result({"error": error} if error is not None else {"value": value or ""})
        return {"answered": True}

    async def _park(self, worker: WorkerHandle, unsaved: list[str], emit: Emit,
                    device: str | None) -> bool:
        """Take the worker off the GPU before its lease ends if it is to be kept: warm for the
        next cell, or pinned because it alone holds `unsaved`. False: it is retired; if parking
        failed, what only it held is lost and the session goes on from the store."""
        if not unsaved and not self.pool.keep_warm:
            return False
        try:
            await self.pool.park(worker, device)
        except parking.ParkFailed as exc:
            if not unsaved:  # the store holds all it had: the next cell starts fresh
                log.warning("session %s: retiring its warm worker: %s", self.name, exc.message)
                return False
            with contextlib.suppress(lineage.NotReplayable):
                lineage.plan(self.store, self.manifest)  # the next cell's worker rebuilds them
                self._notify(emit, "recompute", (
                    f"the worker could not be taken off the GPU ({exc.message}); "
                    f"{', '.join(unsaved)} (which could not be saved) will be recomputed"))
                return False
            self.lost_at = self.head
            self._notify(emit, "lost", (
                f"the worker could not be taken off the GPU ({exc.message}); "
                f"{', '.join(unsaved)} (which could not be saved) are lost, the session goes "
                f"on from version {self.manifest.version}"), lost=True)
            return False
        return True

    def _keep(self, worker: WorkerHandle, owned: set[str], unsaved: list[str]) -> None:
        """Keep the worker as the session's next: it holds the state the head names, so the
        next cell needs no load (and, pinned, it alone holds what could not be saved)."""
        self._discard(self.prepared)  # a draft sent while the cell ran was made for the old head
        future = asyncio.get_running_loop().create_future()
        future.set_result(worker)
        self.prepared = Preparation(self.head, future, kept=True, holds=owned, unsaved=unsaved)
        self.prepared.ready_at = self.prepared.started
        self._spawn(self._when_idle(self.prepared))

    async def _when_idle(self, prep: Preparation) -> None:
        """Free a kept worker's memory once the session has idled, or at once when the host
        runs short of memory: a warm one is retired after `keep_warm` seconds (the store holds
        all it has), a pinned one is dumped to disk after `cool_after` (cool tier).

        From then on a cool `prep.task` ends with the worker restored, once a draft or an
        execute sets `demand`; if the dump or the restore fails, it ends in the error and the
        session goes on from the store, telling the user what only that worker held.
        """
        idle = self.pool.cool_after if prep.unsaved else self.pool.keep_warm
        if not idle:
            return
        while self.prepared is prep:  # a draft's load in flight postpones it
            left = prep.touched + idle - time.monotonic()
            if prep.task.done() and (left <= 0 or self.pool.memory_pressure()):
                break
            await asyncio.sleep(min(max(left, 0.05), 1.0))
        else:
            return
        if self.lock.locked() or not self._usable(prep):
            return
        if not prep.unsaved:
            self.prepared = None
            self._discard(prep)
            return
        worker, demand = prep.task.result(), asyncio.Event()

        async def cooled() -> WorkerHandle:
            image = prep.cooled = await parking.cool(self.pool, worker)
            try:
                await demand.wait()
            finally:
                prep.cooled = None
                if not demand.is_set():
                    parking.discard(image)
            return await parking.thaw(self.pool, image)

        prep.demand = demand
        prep.task = asyncio.ensure_future(cooled())

    def _thaw(self, prep: Preparation | None) -> bool:
        """Ask for the cool worker of `prep` back, if it has one."""
        if prep is None or prep.demand is None:
            return False
        prep.demand.set()
        return True

    def _commit(self, done: dict, source: str, count: int) -> None:
        """Fold the worker's report into a new version (`snapshot.commit`); follow the head."""
        self.head, self.manifest = commit(self.store, self.name, self.head, done, plan(source),
                                          count, self.admit)

    def _worker_pid(self) -> int | None:
        """The worker running a cell, else the one prepared for the next, once it is forked."""
        if self.running is not None:
            return self.running.pid
        prep = self.prepared
        if prep is not None and prep.task.done() and not prep.task.cancelled() \
                and prep.task.exception() is None:
            return prep.task.result().pid
        return None

    def _tier(self) -> dict:
        """hot (running a cell), warm (a live worker kept), cool (on disk) or cold (store only),
        and the bytes that tier holds."""
        if self.running is not None:
            return {"tier": "hot", "memory": self.pool.memory(self.running)}
        prep = self.prepared
        if prep is not None and prep.cooled is not None:
            return {"tier": "cool", "memory": prep.cooled.size}
        if prep is not None and self._worker_pid() is not None:
            return {"tier": "warm", "memory": self.pool.memory(prep.task.result())}
        return {"tier": "cold", "memory": 0}

    def interrupt(self) -> bool:
        """KeyboardInterrupt in the running cell; its worker is killed if the cell still runs
        `interrupt_grace` seconds later (it swallowed the interrupt), so its lease comes back."""
        if self.running is not None:
            if self._answer is not None and not self._answer.done():
                self._answer.set_result(None)
            self.running.interrupt()
            if self._escalation is None:
                self._escalation = asyncio.get_running_loop().call_later(
                    self.interrupt_grace, self._escalate)
            return True
        if self.lock.locked():
            self.interrupted = True
            return True
        return False

    def _escalate(self) -> None:
        self._escalation = None
        if not self._saving:  # the interrupt worked: the cell's code is over, its state saves
            self.stop("interrupt")

    def stop(self, reason: str) -> None:
        """Stop the session's cell now (`reason`, a key of STOPS): kill the worker running it,
        or make sure a cell still waiting for its worker or lease never starts."""
        self.interrupted = self.lock.locked()
        if self.running is not None and not self.running.died.done():
            self._stopped = reason
            self.running.kill()

    async def close(self) -> None:
        self.stop("close")
        prep, self.prepared = self.prepared, None
        self._discard(prep)

    def status(self) -> dict:
        return {"session": self.name, "version": self.manifest.version, "head": self.head,
                "execution_count": int(self.manifest.cell.get("execution_count", 0)),
                "opened": self.opened,
                "variables": len(self.manifest.variables()),
                "bytes": sum(g.size for g in self.manifest.groups),
                "running": self.running is not None,
                "pinned": bool(self.prepared and self.prepared.unsaved
                               and self._usable(self.prepared)),
                "worker": self._worker_pid(),
                "prepared": self.prepared is not None,
                **self._tier(),
                "lease_seconds": self.leases.seconds.get(self.name, 0.0),
                "notices": list(self.notices)}

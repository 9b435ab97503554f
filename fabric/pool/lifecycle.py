"""A session's worker from its fork to its retirement, and the keeper that idles kept ones down.

    STARTING --loaded--> READY --claim--> RUNNING --kept--> KEPT (parked off the GPU)
                                                    \\-----> RETIRED
    KEPT --idle `keep_warm` s, or memory pressure--> RETIRED (the store holds all it had)
    KEPT and pinned (it alone holds values that could not be saved)
         --idle `cool_after` s, or memory pressure--> COOL (CRIU-dumped to disk, memory freed);
         one that ran a debugger stays KEPT (CRIU cannot dump its debugger's connections)
    COOL --demand (a draft or a cell)--> KEPT (restored), or RETIRED if the dump or restore
         failed: ParkFailed, and the session goes on from the store

`Life` is the only code that moves a worker between these stages, and the `Keeper` alone decides
when a kept worker idles down: a timer per kept worker (reset by every draft or question that
reaches it), and, while any worker is kept, memory: pressure (`memory`, sampled once a second and
woken at once by the kernel's stall trigger) and the operator's limits, `kept_memory` (bytes all
kept workers may hold) and `user_memory` (bytes one user's workers may hold). Past any of them,
kept workers leave one at a time in `ranking`'s order (those of the user past their limit alone),
memory read again after each is gone, until it is no longer short. Loads meant for a parked worker
are deferred until its cell's lease puts it back on the GPU: unpickling CUDA tensors or seeding
torch's CUDA RNG would block in the driver until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from ..errors import FabricError, ParkFailed
from ..snapshot import lineage
from ..tasks import Background, within
from ..worker import wake
from ..worker.messages import Load, Sleep, Sleeping
from . import criu, ranking
from .leases import Lease
from .memory import Trigger
from .pool import Pool, WorkerHandle

log = logging.getLogger(__name__)

SLEEP_TIMEOUT = 30.0
PRESSURE_EVERY = 1.0  # seconds between samples of host memory while a worker is kept


class Stage(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RUNNING = "running"
    KEPT = "kept"
    COOL = "cool"
    RETIRED = "retired"


@dataclass
class CoolImage:
    images: Path
    # the dumped tree is a PID namespace rooted at an llfabric-init (a template's copy);
    # otherwise the worker's own tree, restored in a nest (`criu.Nest`)
    init: bool
    parked: bool  # dumped with its CUDA state checkpointed off the GPU
    device: str | None  # the GPU it was parked from
    user: str = ""  # whose cells it ran, whose cage it is restored into

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.images.glob("*.img"))


async def cool(pool: Pool, worker: WorkerHandle, wake_dir: str | None = None) -> CoolImage:
    """Dump a parked worker to disk and end the process; ParkFailed leaves it dead, not half.
    `wake_dir`: where its restored copy connects, when another host's server restores it."""
    images = pool.socket_dir / "cool" / f"w{worker.id}"
    try:
        await worker.send(Sleep(wake_dir))
        reply = await worker.recv(timeout=SLEEP_TIMEOUT)
        if not isinstance(reply, Sleeping):
            raise ParkFailed(f"worker {worker.pid} answered {reply.op!r} to sleep")
        await wake.until_asleep(worker.process, SLEEP_TIMEOUT)
        await asyncio.to_thread(criu.dump, worker.pid if worker.namespace else worker.process,
                                images, keep_under=pool.store_root)
        await within(asyncio.shield(worker.died), SLEEP_TIMEOUT)
    except (FabricError, TimeoutError) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)  # a failed dump lets it run on: end it
        criu.remove(images)
        await worker.close()
        if isinstance(exc, ParkFailed):
            raise
        raise ParkFailed(f"cannot cool worker {worker.pid}: {exc}", pid=worker.pid) from exc
    await worker.close()
    return CoolImage(images, worker.namespace, worker.parked, worker.device, worker.user)


async def thaw(pool: Pool, image: CoolImage) -> WorkerHandle:
    """Restore a cool worker under an init that is the server's child, wake it and await its
    hello. A worker's own tree is restored in a nest, where the pids it had are free whatever
    this host's processes hold; the loop's thread makes the nest, which dies with it."""
    try:
        if image.init:
            root = await asyncio.to_thread(criu.restore, image.images, "restore.log",
                                           pool.store_root)
            process = None
        else:
            nesting = criu.Nesting(image.images, pool.store_root)
            nest = await asyncio.to_thread(nesting.restore, "restore.log")
            root, process = nest.init, nest.root
        return await pool.wake_restored(root, process, "cool", parked=image.parked,
                                        device=image.device, user=image.user)
    except FabricError as exc:
        if isinstance(exc, ParkFailed):
            raise
        raise ParkFailed(f"cannot restore a cool worker: {exc.message}") from exc
    finally:
        criu.remove(image.images)


@dataclass(eq=False)
class Life:
    """One worker of a session, readied for its cells: forked, imports done, closure loaded.

    `task` ends with the worker (once forked and loaded, or restored from a cool image); later
    loads chain onto it (`chain`). `holds` names what the worker has, or will have once `task`
    completes: loaded variables and aliases, or, for a worker kept after its cell, everything
    it owns. `base` is the head manifest its state matches.
    """

    pool: Pool
    base: str | None
    task: asyncio.Future
    holds: set[str] = field(default_factory=set)
    kept: bool = False  # the worker of the session's last cell, kept after it
    unsaved: list[str] = field(default_factory=list)  # kept: what only it holds
    stage: Stage = Stage.STARTING
    deferred: list[Load] = field(default_factory=list)  # loads held back while parked
    # the part of a replay's starting state that holds CUDA memory: loaded under the lease,
    # before the replay
    starting: list[Load] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    loading: float = 0.0  # seconds its worker spent loading the session's state
    # its user's latest sign of working in its session (its cell's end, a draft, a question):
    # idle since then
    touched: float = field(default_factory=time.monotonic)
    drafted: bool = False  # a draft reached it since its cell: the user edits the next one
    rebuild: float = 0.0  # kept: seconds its session's state took to ready on a fresh worker
    ready_at: float | None = None
    cooled: CoolImage | None = None
    restored: bool = False  # its worker was cool, brought back from its image for a cell
    demand: asyncio.Event | None = None  # set: a cool worker is wanted back
    replay: lineage.Replay | None = None  # to run under its first cell's lease, before it
    lease: Lease | None = None  # kept after its cell with the worker on it (see `leases`)

    @classmethod
    def start(cls, pool: Pool, base: str | None,
              make: Callable[[Life], Coroutine]) -> Life:
        """A worker being made by `make(life)` (fork, then load)."""
        life = cls(pool, base, asyncio.get_running_loop().create_future())
        life.task = pool.tasks.start(make(life))
        return life

    @classmethod
    def after_cell(cls, pool: Pool, worker: WorkerHandle, base: str | None, owned: set[str],
                   unsaved: list[str], rebuild: float = 0.0) -> Life:
        """The worker of the session's last cell, kept: its state is the head's (`base`);
        `rebuild`: the seconds its state took to ready on a fresh worker (`ranking`)."""
        future = asyncio.get_running_loop().create_future()
        future.set_result(worker)
        life = cls(pool, base, future, holds=owned, kept=True, unsaved=unsaved,
                   stage=Stage.KEPT, rebuild=rebuild)
        life.ready_at = life.started
        return life

    @classmethod
    def arrived(cls, pool: Pool, image: CoolImage, base: str | None, owned: set[str],
                unsaved: list[str]) -> Life:
        """The pinned worker another host dumped (`image`, fetched here), restored on demand
        like one cooled here."""
        life = cls(pool, base, asyncio.get_running_loop().create_future(), holds=owned,
                   kept=True, unsaved=unsaved)
        life.ready_at = life.started

        async def fetched() -> CoolImage:
            return image

        life._until_wanted(fetched())
        return life

    @property
    def seconds(self) -> float:
        return (self.ready_at or time.monotonic()) - self.started

    def worker(self) -> WorkerHandle | None:
        """The live worker, once it is forked and loaded; None before, or once it is gone."""
        if self.stage in (Stage.RETIRED, Stage.COOL) or not self.task.done() \
                or self.task.cancelled() or self.task.exception() is not None:
            return None
        worker = self.task.result()
        return None if worker.died.done() else worker

    def usable(self, head: str | None) -> bool:
        """Whether a cell on `head` can still run on it (it may still be loading)."""
        if self.base != head or self.stage is Stage.RETIRED:
            return False
        return not self.task.done() or self.worker() is not None

    def chain(self, step: Callable[[WorkerHandle], Coroutine], prepares: bool = True) -> None:
        """Run `step` on the worker once the steps before it are done (a draft's extra load,
        or, not `prepares`, a question between cells); the worker is retired if it fails."""
        self.touch()
        previous = self.task

        async def chained() -> WorkerHandle:
            worker = await previous
            try:
                await step(worker)
            except BaseException:
                await worker.close()
                raise
            if prepares:
                self.ready_at = time.monotonic()
            return worker

        self.task = self.pool.tasks.start(chained())

    def touch(self, drafted: bool = False) -> None:
        """A sign of use: a step on its worker, or (`drafted`) a draft of the next cell."""
        self.touched = time.monotonic()
        self.drafted |= drafted

    def loaded(self) -> None:
        self.ready_at = time.monotonic()
        self.stage = Stage.READY if self.stage is Stage.STARTING else self.stage

    def claim(self) -> None:
        """A cell takes the worker: no keeper touches it until it is kept again."""
        self.stage = Stage.RUNNING

    def wake(self) -> bool:
        """Ask for a cool worker back; False if it is not cool."""
        if self.demand is None:
            return False
        self.demand.set()
        return True

    def cool(self) -> asyncio.Future:
        """Dump the kept worker to disk; `task` ends with it restored once `wake` is called.
        The future returned is done once it is on disk and its memory free, or its dump failed
        (and it is retired)."""
        return self._until_wanted(cool(self.pool, self.task.result()))

    async def hand_over(self, wake_dir: str) -> CoolImage:
        """Dump the kept worker for another host's server (see `cool`); it is retired here.
        A cool one is restored first: its image would wake to this host's server."""
        self.wake()
        worker = await self.task
        self.claim()  # no keeper takes it meanwhile
        try:
            return await cool(self.pool, worker, wake_dir)
        finally:
            self.stage = Stage.RETIRED

    def _until_wanted(self, dumped: Coroutine) -> asyncio.Future:
        """COOL: `task` ends with the worker `dumped` gives the image of, restored once `wake`
        is called; the future returned is done once `dumped` is."""
        demand = asyncio.Event()
        on_disk = asyncio.get_running_loop().create_future()

        async def cooled() -> WorkerHandle:
            try:
                image = self.cooled = await dumped
            finally:
                _settle(on_disk)
            try:
                await demand.wait()
            finally:
                self.cooled = None
                if not demand.is_set():
                    criu.remove(image.images)
            self.started, self.ready_at = time.monotonic(), None  # its prepare: the restore
            worker = await thaw(self.pool, image)
            self.stage, self.ready_at, self.restored = Stage.KEPT, time.monotonic(), True
            return worker

        self.stage, self.demand = Stage.COOL, demand
        self.task = self.pool.tasks.start(cooled())
        self.task.add_done_callback(self._failed)
        self.task.add_done_callback(lambda _: _settle(on_disk))  # cancelled before it began
        return on_disk

    def _failed(self, task: asyncio.Future) -> None:
        if task.cancelled() or task.exception() is not None:
            exc = None if task.cancelled() else task.exception()
            if exc is not None:  # its session finds no worker: say why
                tail = getattr(exc.__cause__, "fields", {}).get("log", "")
                log.warning("a kept worker is lost: %s%s", exc, f"\n{tail}" if tail else "")
            self.stage = Stage.RETIRED

    def retire(self) -> Coroutine | None:
        """End the worker; the coroutine that closes it, to run in the background (None: a
        cool one nobody needs, whose image is simply dropped)."""
        stage, self.stage = self.stage, Stage.RETIRED
        if stage is Stage.COOL and not (self.demand and self.demand.is_set()):
            self.task.cancel()
            return None

        async def close() -> None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await (await self.task).close()

        return close()


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Keeper:
    """Decides, alone, when the host's kept workers idle down (see the module's notes).

    `kept_memory`: bytes all kept workers may hold; `user_memory`: bytes one user's workers
    (kept or running) may hold; 0: no limit."""

    def __init__(self, pool: Pool, kept_memory: int = 0, user_memory: int = 0) -> None:
        self.pool = pool
        self.kept_memory, self.user_memory = kept_memory, user_memory
        self.kept: set[Life] = set()
        # workers made to leave before their idle time, by why (memory_pressure, kept_memory,
        # user_memory) and how (retired, cooled)
        self.evicted: Counter[tuple[str, str]] = Counter()
        self._tasks = Background("keeper")  # its watch, and retired workers' closes
        self._changed = asyncio.Event()
        self._watch: asyncio.Task | None = None

    def keep(self, life: Life) -> None:
        if self._idle(life) is None:
            return
        self.kept.add(life)
        self.changed()
        if self._watch is None or self._watch.done():
            self._watch = self._tasks.start(self._run(), "watching the kept workers")

    def changed(self) -> None:
        """A kept worker was touched, claimed or retired: reconsider the deadlines."""
        self._changed.set()

    def _idle(self, life: Life) -> float | None:
        if not life.unsaved:
            return self.pool.keep_warm or None
        worker = life.worker()
        # a worker that ran a debugger cannot be dumped: it stays warm, holding what it alone has
        return None if worker is not None and worker.debugged else self.pool.cool_after or None

    async def _run(self) -> None:
        trigger = self.pool.pressure.trigger()
        loop = asyncio.get_running_loop()
        if trigger is not None:  # a stall wakes the watch at once
            loop.add_reader(trigger.fileno(), self._stalled, trigger)
        try:
            while self.kept:
                self._changed.clear()
                wait = self._idle_down_expired()
                while (short := self._short()) is not None:
                    await self._evict(*short)
                with contextlib.suppress(TimeoutError):
                    await within(self._changed.wait(), max(wait, 0.05))
        finally:
            if trigger is not None:
                loop.remove_reader(trigger.fileno())
                trigger.close()

    def _stalled(self, trigger: Trigger) -> None:
        trigger.drain()
        self.pool.pressure.stalled()
        self.changed()

    def _idle_down_expired(self) -> float:
        """Idle down the kept workers whose idle time is up; the seconds until the next's is
        (at most PRESSURE_EVERY: memory is read again then)."""
        now, wait = time.monotonic(), PRESSURE_EVERY
        for life in list(self.kept):
            if life.stage is not Stage.KEPT or life.demand is not None:
                self.kept.discard(life)  # claimed, retired or cooled: no longer idling
                continue
            if not life.task.done():  # a draft's load in flight postpones it
                continue
            left = life.touched + (self._idle(life) or 0.0) - now
            if left <= 0:
                self.kept.discard(life)
                self._idle_down(life)
            else:
                wait = min(wait, left)
        return wait

    def _leavable(self) -> list[Life]:
        """The kept workers that may leave now: idle (no load in flight), and, if pinned, able
        to be dumped."""
        return [life for life in self.kept if life.stage is Stage.KEPT and life.demand is None
                and life.task.done() and life.worker() is not None
                and self._idle(life) is not None]

    def _short(self) -> tuple[Life, str] | None:
        """The kept worker to leave first, and why, while memory is short or past a limit;
        None while it is not (or no worker may leave)."""
        leavable = self._leavable()
        if not leavable:
            return None
        if self.pool.memory_pressure():
            return self._ranked(leavable)[0], "memory_pressure"
        if self.kept_memory:
            held = sum(self.pool.memory(w) for life in self.kept
                       if (w := life.worker()) is not None)
            if held > self.kept_memory:
                return self._ranked(leavable)[0], "kept_memory"
        if self.user_memory:
            for user, held in self.pool.memory_by_user().items():
                theirs = [life for life in leavable if _user(life) == user]
                if held > self.user_memory and theirs:
                    return self._ranked(theirs)[0], "user_memory"
        return None

    def _ranked(self, lives: list[Life]) -> list[Life]:
        now = time.monotonic()
        ranked = ranking.rank(ranking.Kept(life, now - life.touched, life.drafted,
                                           life.rebuild, bool(life.unsaved)) for life in lives)
        return [kept.key for kept in ranked]  # type: ignore[misc]  # the lives given

    async def _evict(self, life: Life, why: str) -> None:
        """Make `life`'s worker leave now (`why`: the limit passed) and wait until its memory
        is free: retired, or cooled if it holds what the store cannot."""
        self.kept.discard(life)
        how = "cooled" if life.unsaved else "retired"
        log.info("%s: %s a kept worker (idle %.0f s%s)", why.replace("_", " "), how,
                 time.monotonic() - life.touched, ", drafted" if life.drafted else "")
        self.evicted[why, how] += 1
        if life.unsaved:
            await life.cool()
        elif (closing := life.retire()) is not None:
            await closing

    async def fit(self, user: str, spare: Life | None) -> int:
        """Before a cell of `user` (a worker's user, "" the server's own): while their workers
        hold `user_memory` or more, their kept workers leave, ranked, except `spare` (the one
        the cell runs on); the bytes their workers hold then."""
        if not self.user_memory:
            return 0
        while (held := self.pool.memory_by_user().get(user, 0)) >= self.user_memory:
            theirs = [life for life in self._leavable()
                      if life is not spare and _user(life) == user]
            if not theirs:
                break
            await self._evict(self._ranked(theirs)[0], "user_memory")
        return held

    def status(self) -> KeptMap:
        """Memory as the keeper sees it: the latest reading, what kept workers hold, the limits
        and the workers made to leave."""
        short = self.pool.memory_pressure()  # read now: nothing may be kept to read it
        reading = self.pool.pressure.last
        return {"pressure": short, "used_percent": reading.used,
                "stall_percent": reading.stall, "source": reading.source,
                "kept": sum(self.pool.memory(w) for life in self.kept
                            if (w := life.worker()) is not None),
                "kept_memory": self.kept_memory, "user_memory": self.user_memory,
                "evicted": [{"why": why, "how": how, "count": count}
                            for (why, how), count in sorted(self.evicted.items())]}

    def _idle_down(self, life: Life) -> None:
        if life.worker() is None:
            return
        if life.unsaved:
            life.cool()
        elif (closing := life.retire()) is not None:
            self.close_later(closing)

    def close_later(self, closing: Coroutine) -> None:
        """Close a retired worker in the background, past the session that let it go."""
        self._tasks.start(closing, "closing a worker")

    async def stop(self) -> None:
        await self._tasks.close()


def _user(life: Life) -> str | None:
    worker = life.worker()
    return worker.user if worker is not None else None


class Evicted(TypedDict):
    why: str  # memory_pressure, kept_memory or user_memory
    how: str  # retired or cooled
    count: int


class KeptMap(TypedDict):
    """Host memory and the kept workers, as `status` reports them."""

    pressure: bool
    used_percent: float  # of the host's memory, or its cgroup's limit
    stall_percent: float | None  # of the last 10 s, some task stalled on memory (PSI)
    source: str  # host, or cgroup PATH
    kept: int  # bytes (PSS) the kept workers hold
    kept_memory: int
    user_memory: int
    evicted: list[Evicted]

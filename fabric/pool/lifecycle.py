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
when a kept worker idles down: a timer per kept worker (reset by every draft that touches it),
and host memory sampled once a second while any worker is kept. Loads meant for a parked worker
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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FabricError, ParkFailed
from ..snapshot import lineage
from ..tasks import Background
from ..worker import wake
from ..worker.messages import Load, Sleep, Sleeping
from . import criu
from .leases import Lease
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
        await asyncio.wait_for(asyncio.shield(worker.died), SLEEP_TIMEOUT)
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
    touched: float = field(default_factory=time.monotonic)  # its last draft: idle since then
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
                   unsaved: list[str]) -> Life:
        """The worker of the session's last cell, kept: its state is the head's (`base`)."""
        future = asyncio.get_running_loop().create_future()
        future.set_result(worker)
        life = cls(pool, base, future, holds=owned, kept=True, unsaved=unsaved,
                   stage=Stage.KEPT)
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

    def touch(self) -> None:
        self.touched = time.monotonic()

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

    def cool(self) -> None:
        """Dump the kept worker to disk; `task` ends with it restored once `wake` is called."""
        self._until_wanted(cool(self.pool, self.task.result()))

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

    def _until_wanted(self, dumped: Coroutine) -> None:
        """COOL: `task` ends with the worker `dumped` gives the image of, restored once `wake`
        is called."""
        demand = asyncio.Event()

        async def cooled() -> WorkerHandle:
            image = self.cooled = await dumped
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


class Keeper:
    """Decides, alone, when the host's kept workers idle down (see the module's notes)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.kept: set[Life] = set()
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
        while self.kept:
            self._changed.clear()
            now, pressure = time.monotonic(), self.pool.memory_pressure()
            wait = PRESSURE_EVERY
            for life in list(self.kept):
                if life.stage is not Stage.KEPT or life.demand is not None:
                    self.kept.discard(life)  # claimed, retired or cooled: no longer idling
                    continue
                if not life.task.done():  # a draft's load in flight postpones it
                    continue
                left = life.touched + (self._idle(life) or 0.0) - now
                if left <= 0 or pressure:
                    self.kept.discard(life)
                    self._idle_down(life)
                else:
                    wait = min(wait, left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(wait, 0.05))

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

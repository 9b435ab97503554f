"""Parking: a session's worker kept between cells without holding what it need not hold.

warm: the worker is alive; on a GPU host its CUDA state is checkpointed into host memory
      (`suspend`), so the GPU is free for other sessions' cells. `resume` puts it back.
cool: the parked worker is CRIU-dumped to local disk (`cool`) and its memory freed; `thaw`
      restores it as a child of the server and wakes it (see `wake`). A cool image is restored
      once and then deleted.

Every step that fails raises `ParkFailed` after leaving nothing half done: the caller retires
the worker and the session continues from its last committed version in the store (cold).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import FabricError
from ..worker import wake
from . import criu
from .cuda import CudaError, Driver, State

if TYPE_CHECKING:
    from .pool import Pool, WorkerHandle

LOCK_TIMEOUT_MS = 10_000  # a cell's stray CUDA work (async kernels) must finish within this
SLEEP_TIMEOUT = 30.0


class ParkFailed(FabricError):
    """A worker could not be parked or resumed; the session falls back to the store."""

    kind = "park"


def suspend(driver: Driver, pid: int, timeout_ms: int = LOCK_TIMEOUT_MS) -> bool:
    """RUNNING -> LOCKED -> CHECKPOINTED: the worker's device memory is in host memory.

    False when the worker never touched CUDA: it holds no GPU, there is nothing to move."""
    if not driver.holds(pid):
        return False
    state = driver.state(pid)
    if state is State.CHECKPOINTED:
        return True
    if state is not State.RUNNING:
        raise ParkFailed(f"cannot park worker {pid}: its CUDA state is {state.name}", pid=pid)
    try:
        driver.lock(pid, timeout_ms)  # on a timeout the driver leaves it RUNNING
    except CudaError as exc:
        raise ParkFailed(f"cannot lock worker {pid}: {exc.message}", pid=pid) from exc
    try:
        driver.checkpoint(pid)
    except CudaError as exc:
        _unlock_if_locked(driver, pid)
        raise ParkFailed(f"cannot checkpoint worker {pid}: {exc.message}", pid=pid) from exc
    if (state := driver.state(pid)) is not State.CHECKPOINTED:
        raise ParkFailed(f"worker {pid} is {state.name} after its checkpoint", pid=pid)
    return True


def resume(driver: Driver, pid: int, moves: dict[str, str] | None = None) -> None:
    """CHECKPOINTED -> LOCKED -> RUNNING: the worker's device memory is back on a GPU (moved
    from the GPU it was parked from onto another by `moves`, old UUID -> new)."""
    try:
        state = driver.state(pid)
        if state is State.CHECKPOINTED:
            driver.restore(pid, moves)
            state = driver.state(pid)
        if state is State.LOCKED:
            driver.unlock(pid)
            state = driver.state(pid)
    except CudaError as exc:
        raise ParkFailed(f"cannot resume worker {pid}: {exc.message}", pid=pid) from exc
    if state is not State.RUNNING:
        raise ParkFailed(f"worker {pid} is {state.name} after its resume", pid=pid)


def _unlock_if_locked(driver: Driver, pid: int) -> None:
    """Best effort back to RUNNING after a failed checkpoint; the caller reports the failure."""
    with contextlib.suppress(CudaError):
        if driver.state(pid) is State.LOCKED:
            driver.unlock(pid)


@dataclass
class CoolImage:
    images: Path
    init: bool  # the dumped tree is rooted at an llfabric-init (a template's copy)
    parked: bool  # dumped with its CUDA state checkpointed off the GPU
    device: str | None  # the GPU it was parked from
    deferred: list[dict] = field(default_factory=list)  # its loads held back while parked

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.images.glob("*.img"))


async def cool(pool: Pool, worker: WorkerHandle) -> CoolImage:
    """Dump a parked worker to disk and end the process; ParkFailed leaves it dead, not half."""
    images = pool.socket_dir / "cool" / f"w{worker.id}"
    try:
        await worker.send({"op": "sleep"})
        reply = await worker.recv(timeout=SLEEP_TIMEOUT)
        if reply.get("op") != "sleeping":
            raise ParkFailed(f"worker {worker.pid} answered {reply.get('op')!r} to sleep")
        await wake.until_asleep(worker.process, SLEEP_TIMEOUT)
        await asyncio.to_thread(criu.dump, worker.pid, images)
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
    return CoolImage(images, worker.init, worker.parked, worker.device, worker.deferred)


def discard(image: CoolImage) -> None:
    criu.remove(image.images)


async def thaw(pool: Pool, image: CoolImage) -> WorkerHandle:
    """Restore a cool worker as a child of the server, wake it and await its hello."""
    try:
        root = await asyncio.to_thread(criu.restore, image.images, "restore.log")
        worker = await pool.wake_restored(root, image.init, "cool", parked=image.parked,
                                          device=image.device)
        worker.deferred = image.deferred
        return worker
    except FabricError as exc:
        if isinstance(exc, ParkFailed):
            raise
        raise ParkFailed(f"cannot restore a cool worker: {exc.message}") from exc
    finally:
        discard(image)

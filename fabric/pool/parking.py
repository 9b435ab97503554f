"""Parking: a kept worker's CUDA state checkpointed into host memory (`suspend`), so the GPU
is free for other sessions' cells between its own; `resume` puts it back, on the GPU of the next
cell's lease. Before its checkpoint the worker moves its torch storages off the GPU itself, at
copy speed (`move_off`, see `worker.parking`), and back after its restore (`move_back`): the
driver's checkpoint, far slower, then moves only the rest (its context, workspaces), or the
whole process where the worker could not account for its device memory. A worker is parked
with the processes its cells started and left running (DDP ranks, DataLoader workers):
`suspend_tree` and `resume_tree`. (A kept worker's further stages,
cool on disk included: `lifecycle`.)

Every step that fails raises `ParkFailed` after leaving nothing half done: the caller retires
the worker and the session continues from its last committed version in the store (cold).
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from ..errors import ParkFailed, WorkerDied
from ..worker.messages import Park, Parked, Unpark, WorkerMessage
from .cuda import CudaError, Driver, ProcessState

LOCK_TIMEOUT_MS = 10_000  # a cell's stray CUDA work (async kernels) must finish within this
MOVE_TIMEOUT = 600.0  # seconds a worker has to copy its storages (GBs, through host memory)


class Parkable(Protocol):
    """What parking asks of a worker: its pid and its socket (the pool's `WorkerHandle`)."""

    pid: int

    async def send(self, message: WorkerMessage) -> None: ...

    async def recv(self, timeout: float | None = None) -> WorkerMessage: ...


async def move_off(worker: Parkable) -> Parked:
    """Have the worker move its torch storages off the GPU; what it moved, or why nothing (its
    `fallback`: the driver's checkpoint takes the whole process)."""
    return await _ask(worker, Park(), "move its memory off the GPU")


async def move_back(worker: Parkable) -> Parked:
    """Have the worker put back on the GPU what `move_off` moved (after its restore)."""
    return await _ask(worker, Unpark(), "put its memory back on the GPU")


async def _ask(worker: Parkable, message: Park | Unpark, doing: str) -> Parked:
    try:
        await worker.send(message)
        reply = await worker.recv(timeout=MOVE_TIMEOUT)
    except WorkerDied as exc:
        raise ParkFailed(f"worker {worker.pid} could not {doing}: {exc.message}",
                         pid=worker.pid) from exc
    if not isinstance(reply, Parked):
        raise ParkFailed(f"worker {worker.pid} answered {reply.op!r} to {message.op}",
                         pid=worker.pid)
    if reply.error is not None:
        raise ParkFailed(f"worker {worker.pid} could not {doing}: {reply.error}",
                         pid=worker.pid)
    return reply


def suspend(driver: Driver, pid: int, timeout_ms: int = LOCK_TIMEOUT_MS) -> bool:
    """RUNNING -> LOCKED -> CHECKPOINTED: the worker's device memory is in host memory.

    False when the worker never touched CUDA: it holds no GPU, there is nothing to move."""
    if not driver.holds(pid):
        return False
    state = driver.state(pid)
    if state is ProcessState.CHECKPOINTED:
        return True
    if state is not ProcessState.RUNNING:
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
    if (state := driver.state(pid)) is not ProcessState.CHECKPOINTED:
        raise ParkFailed(f"worker {pid} is {state.name} after its checkpoint", pid=pid)
    return True


def resume(driver: Driver, pid: int, moves: dict[str, str] | None = None) -> None:
    """CHECKPOINTED -> LOCKED -> RUNNING: the worker's device memory is back on a GPU (moved
    from the GPU it was parked from onto another by `moves`, old UUID -> new)."""
    try:
        state = driver.state(pid)
        if state is ProcessState.CHECKPOINTED:
            driver.restore(pid, moves)
            state = driver.state(pid)
        if state is ProcessState.LOCKED:
            driver.unlock(pid)
            state = driver.state(pid)
    except CudaError as exc:
        raise ParkFailed(f"cannot resume worker {pid}: {exc.message}", pid=pid) from exc
    if state is not ProcessState.RUNNING:
        raise ParkFailed(f"worker {pid} is {state.name} after its resume", pid=pid)


def suspend_tree(driver: Driver, pids: list[int], timeout_ms: int = LOCK_TIMEOUT_MS) -> bool:
    """`suspend` the worker `pids[0]` and the processes it started (the rest), all or none:
    when one fails, those already parked are put back before ParkFailed goes up. False when
    none of them touched CUDA."""
    parked: list[int] = []
    try:
        for pid in pids:
            if suspend(driver, pid, timeout_ms):
                parked.append(pid)
    except ParkFailed:
        for pid in parked:
            with contextlib.suppress(ParkFailed):
                resume(driver, pid)
        raise
    return bool(parked)


def resume_tree(driver: Driver, pids: list[int], moves: dict[str, str] | None = None) -> None:
    """`resume` the worker `pids[0]`, and those of the processes it started that were parked
    with it (one the driver knows nothing of never touched CUDA)."""
    resume(driver, pids[0], moves)
    for pid in pids[1:]:
        try:
            state = driver.state(pid)
        except CudaError:
            continue
        if state is not ProcessState.RUNNING:
            resume(driver, pid, moves)


def _unlock_if_locked(driver: Driver, pid: int) -> None:
    """Best effort back to RUNNING after a failed checkpoint; the caller reports the failure."""
    with contextlib.suppress(CudaError):
        if driver.state(pid) is ProcessState.LOCKED:
            driver.unlock(pid)

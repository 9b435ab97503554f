"""A kept worker lingering on its cell's lease: a next cell in the leases' `linger` seconds
starts on it as it is; when the time is up, another session's cell waits for slots, or the worker
dies, it is parked and the lease given back."""

from __future__ import annotations

import asyncio
import logging

from ..errors import ParkFailed
from ..tasks import Background
from .leases import Lease, Leases
from .lifecycle import Keeper, Life
from .pool import Pool, WorkerHandle

log = logging.getLogger(__name__)


class Lingering:
    """The leases one session's kept workers linger on."""

    def __init__(self, name: str, pool: Pool, leases: Leases, keeper: Keeper) -> None:
        self.name, self.pool, self.leases, self.keeper = name, pool, leases, keeper
        self._tasks = Background(f"session {name}")

    def start(self, life: Life, worker: WorkerHandle, lease: Lease) -> None:
        """Keep `life`'s worker on `lease` until the linger ends (`_linger`)."""
        life.lease = lease
        self._tasks.start(self._linger(life, worker, self.leases.start_lingering(lease)),
                          "letting a kept worker's lease go")

    async def _linger(self, life: Life, worker: WorkerHandle, wanted: asyncio.Event) -> None:
        """Let go of `life`'s lease after the linger, as soon as it is `wanted` (a cell waits
        for slots) or its worker dies, unless its next cell took it or it was discarded
        meanwhile."""
        async with asyncio.TaskGroup() as group:
            waiting = group.create_task(wanted.wait())
            await asyncio.wait({waiting, worker.died}, timeout=self.leases.linger,
                               return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
        self.let_go(life)

    def let_go(self, life: Life) -> None:
        """Park `life`'s worker off the lease it lingers on, then give the lease back (after
        what was chained on the worker before); a worker that cannot be parked is retired."""
        lease, life.lease = life.lease, None
        if lease is None:
            return

        async def park(worker: WorkerHandle) -> None:
            try:
                await self.pool.park(worker, lease.device)
            except ParkFailed as exc:
                log.warning("session %s: retiring its kept worker: %s", self.name, exc.message)
                raise

        def parked(task: asyncio.Future) -> None:
            self.leases.release(lease)
            if not task.cancelled():
                task.exception()  # a failed park was told: the next cell finds no worker

        life.chain(park, prepares=False)
        life.task.add_done_callback(parked)
        self.keeper.keep(life)

    def take(self, life: Life | None, slots: int) -> Lease | None:
        """The lease `life`'s worker lingers on, for a cell of `slots` slots; None if it has
        none, or one of another size, which it lets go of."""
        if life is None or life.lease is None:
            return None
        if len(life.lease.slots) != slots:
            self.let_go(life)
            return None
        lease, life.lease = life.lease, None
        self.leases.resume(lease)
        return lease

    def give_back(self, lease: Lease | None) -> None:
        """Release a lingering lease taken for a cell that failed before it ran on it."""
        if lease is not None:
            self.leases.release(lease)

    async def close(self) -> None:
        await self._tasks.close()

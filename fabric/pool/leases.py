"""Leases: exclusive use of one execution slot for the duration of one cell.

On hosts without GPUs the slots are CPU slots, one per core unless configured. Waiters are
served first come, first served, so no session starves; the wait is reported as part of the
cell's visible delay and lease-seconds are accounted per session.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Lease:
    session: str
    slot: int
    acquired: float
    waited: float
    released: float | None = None

    @property
    def held(self) -> float:
        return (self.released or time.monotonic()) - self.acquired


@dataclass
class Leases:
    slots: int = 0
    kind: str = "cpu"
    _free: list[int] = field(default_factory=list)
    _waiters: list[asyncio.Future] = field(default_factory=list)
    held: dict[int, Lease] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def __post_init__(self) -> None:
        self.slots = self.slots or os.cpu_count() or 1
        self._free = list(range(self.slots))

    async def acquire(self, session: str) -> Lease:
        start = time.monotonic()
        if not self._free or self._waiters:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._free.append(waiter.result())  # handed a slot while being cancelled
                raise
            slot = waiter.result()
        else:
            slot = self._free.pop(0)
        now = time.monotonic()
        lease = Lease(session, slot, now, now - start)
        self.held[slot] = lease
        return lease

    def release(self, lease: Lease) -> None:
        if lease.released is not None:
            return
        lease.released = time.monotonic()
        self.seconds[lease.session] += lease.held
        del self.held[lease.slot]
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(lease.slot)
                return
        self._free.append(lease.slot)

    @property
    def queued(self) -> int:
        return len(self._waiters)

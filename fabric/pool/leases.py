"""Leases: exclusive use of one execution slot for the duration of one cell.

A slot is a GPU (from NVML) on hosts that have them, else a CPU slot (one per core unless
configured); both go through this one interface. More sessions than slots is normal: waiters
are served first come, first served, so no session starves; the wait is reported as part of the
cell's visible delay and lease-seconds are accounted per session. A cell whose worker was
parked off a GPU gets that GPU when it is free (no move), else any free one.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ..worker import threads
from . import gpus


@dataclass
class Lease:
    session: str
    slot: int
    acquired: float
    waited: float
    device: str | None = None  # the GPU's UUID, for CUDA_VISIBLE_DEVICES; None for a CPU slot
    released: float | None = None

    @property
    def held(self) -> float:
        return (self.released or time.monotonic()) - self.acquired


@dataclass
class _Waiter:
    session: str
    since: float
    future: asyncio.Future


@dataclass
class Leases:
    slots: int = 0
    threads: int = 0  # intra-op threads of a worker under a lease; 0: its share of the cores
    kind: str = "cpu"
    devices: list[gpus.Gpu] = field(default_factory=list)
    _free: list[int] = field(default_factory=list)
    _waiters: list[_Waiter] = field(default_factory=list)
    held: dict[int, Lease] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def __post_init__(self) -> None:
        if self.devices:
            self.kind, self.slots = "gpu", len(self.devices)
        self.slots = self.slots or os.cpu_count() or 1
        self.threads = threads.granted(os.cpu_count() or 1, self.slots, self.threads)
        self._free = list(range(self.slots))

    @classmethod
    def for_host(cls, cpu_slots: int = 0, threads: int = 0) -> Leases:
        """One lease per GPU where NVML finds any, else `cpu_slots` CPU slots (0: per core);
        `threads` per lease (0: the host's cores shared among the slots)."""
        return cls(cpu_slots, threads, devices=gpus.discover())

    async def acquire(self, session: str, prefer: str | None = None) -> Lease:
        """A free slot (`prefer`'s, the UUID of a GPU, if free), else the first to be released
        once those who asked before have theirs."""
        start = time.monotonic()
        if not self._free or self._waiters:
            waiter = _Waiter(session, start, asyncio.get_running_loop().create_future())
            self._waiters.append(waiter)
            try:
                await waiter.future
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.future.done() and not waiter.future.cancelled():
                    self._give(waiter.future.result())  # handed a slot while being cancelled
                raise
            slot = waiter.future.result()
        else:
            preferred = self._slot_of(prefer)
            slot = preferred if preferred in self._free else self._free[0]
            self._free.remove(slot)
        now = time.monotonic()
        device = self.devices[slot].uuid if self.devices else None
        lease = Lease(session, slot, now, now - start, device)
        self.held[slot] = lease
        return lease

    def _slot_of(self, device: str | None) -> int | None:
        return next((slot for slot, gpu in enumerate(self.devices) if gpu.uuid == device), None)

    def release(self, lease: Lease) -> None:
        if lease.released is not None:
            return
        lease.released = time.monotonic()
        self.seconds[lease.session] += lease.held
        del self.held[lease.slot]
        self._give(lease.slot)

    def _give(self, slot: int) -> None:
        """Hand `slot` to the longest waiter, or put it back."""
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.future.done():
                waiter.future.set_result(slot)
                return
        self._free.append(slot)

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def full(self) -> bool:
        """Whether a lease asked for now would wait: cells queue, or every slot is held."""
        return self.queued > 0 or len(self.held) >= self.slots

    def status(self) -> dict:
        now = time.monotonic()
        slots = []
        for slot in range(self.slots):
            entry: dict = {"slot": slot}
            if self.devices:
                gpu = self.devices[slot]
                entry |= {"uuid": gpu.uuid, "name": gpu.name, **gpus.usage(gpu)}
            if (lease := self.held.get(slot)) is not None:
                entry |= {"session": lease.session, "held": lease.held}
            slots.append(entry)
        return {"kind": self.kind, "slots": self.slots, "threads": self.threads,
                "held": len(self.held),
                "queued": self.queued, "leases": slots,
                "queue": [{"session": w.session, "waiting": now - w.since}
                          for w in self._waiters]}

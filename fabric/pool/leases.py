"""Leases: exclusive use of one or more execution slots, together, for the duration of one cell.

A slot is a GPU (from NVML) on hosts that have them, else a CPU slot (one per core unless
configured); both go through this one interface. A cell that needs K slots gets all K at once
or waits holding none (a gang: two cells each holding some of what the other waits for would
deadlock), in a stable order (its slots ascending, its GPUs in that order as one
CUDA_VISIBLE_DEVICES value), and gives them back together. More requests than slots is normal:
`queueing` decides who is served (first come, first served, with a reservation for the oldest
and backfill that cannot delay it), the wait is reported as part of the cell's visible delay,
and slot-seconds are accounted per session. A cell whose worker was parked off GPUs gets those
that are free (no move), else any free ones.

A lease may *linger* after its cell (`linger` seconds, the agent's choice): its worker stays on
it, so the session's next cell starts at once. It is never waited for: the moment any cell
waits for slots, every lingering lease is told to let go (`Lease.lingering` is set), and its
worker parks and gives it back as it would have right after its cell.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TypedDict

from ..errors import SlotsUnavailable
from ..worker import threads
from . import gpus, queueing

RECENT = 5  # a session's last runs its next one's estimate is taken from


@dataclass
class Lease:
    session: str
    slots: tuple[int, ...]  # ascending
    acquired: float
    waited: float
    devices: tuple[str, ...] = ()  # the GPUs' UUIDs, in the slots' order; none for CPU slots
    threads: int = 1  # intra-op threads: the slots' shares of the host's cores together
    ends: float | None = None  # when it is expected back, from the session's recent runs
    released: float | None = None
    lingering: asyncio.Event | None = None  # its cell ended: set when it must be let go
    taken: float = 0.0  # when the cell it serves now took it (acquired, or its linger began)

    @property
    def device(self) -> str | None:
        """CUDA_VISIBLE_DEVICES for the cell: its GPUs, comma-joined; None on CPU slots."""
        return ",".join(self.devices) or None

    @property
    def held(self) -> float:
        return (self.released or time.monotonic()) - self.acquired


@dataclass
class _Waiter:
    session: str
    count: int
    since: float
    estimate: float | None
    prefer: frozenset[int]  # slots to take first when free: those its worker was parked from
    future: asyncio.Future


@dataclass
class Leases:
    slots: int = 0
    threads: int = 0  # intra-op threads per slot leased; 0: its share of the cores
    kind: str = "cpu"
    devices: list[gpus.Gpu] = field(default_factory=list)
    patience: float = queueing.PATIENCE  # see `queueing`
    linger: float = 0.0  # seconds a lease stays with its session's worker after its cell
    _free: list[int] = field(default_factory=list)
    _waiters: list[_Waiter] = field(default_factory=list)
    held: dict[int, Lease] = field(default_factory=dict)  # slot -> the lease holding it
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    recent: dict[str, deque[float]] = field(
        default_factory=lambda: defaultdict(lambda: deque(maxlen=RECENT)))

    def __post_init__(self) -> None:
        if self.devices:
            self.kind, self.slots = "gpu", len(self.devices)
        self.slots = self.slots or os.cpu_count() or 1
        self.threads = threads.granted(os.cpu_count() or 1, self.slots, self.threads)
        self._free = list(range(self.slots))

    @classmethod
    def for_host(cls, cpu_slots: int = 0, threads: int = 0, linger: float = 0.0) -> Leases:
        """One slot per GPU where NVML finds any, else `cpu_slots` CPU slots (0: per core);
        `threads` per slot (0: the host's cores shared among the slots)."""
        return cls(cpu_slots, threads, devices=gpus.discover(), linger=linger)

    async def acquire(self, session: str, count: int = 1, prefer: str | None = None) -> Lease:
        """`count` slots together, when `queueing` says so; `prefer` (CUDA_VISIBLE_DEVICES of
        the GPUs a worker was parked from) names the ones to take first if free. More slots
        than the host has is refused at once: waiting would never end."""
        self.check(session, count)
        waiter = _Waiter(session, count, time.monotonic(),
                         queueing.estimate(self.recent.get(session, ())), self._slots_of(prefer),
                         asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._admit()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                self._admit()  # it may have held back those behind it
            elif waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result())  # granted while being cancelled
            raise

    def check(self, session: str, count: int) -> None:
        """SlotsUnavailable unless a cell of `session` may lease `count` slots here."""
        if not 1 <= count <= self.slots:
            raise SlotsUnavailable(
                f"a cell may lease 1 to {self.slots} {self.kind} slots on this host, "
                f"not {count}", session=session, asked=count, slots=self.slots)

    def _slots_of(self, devices: str | None) -> frozenset[int]:
        names = set((devices or "").split(","))
        return frozenset(slot for slot, gpu in enumerate(self.devices) if gpu.uuid in names)

    def _admit(self) -> None:
        """Grant what `queueing` admits now, oldest first."""
        self._waiters = [w for w in self._waiters if not w.future.done()]  # cancelled ones
        now = time.monotonic()
        chosen = [self._waiters[i] for i in self._admissions(now)]
        for waiter in chosen:
            self._waiters.remove(waiter)
            waiter.future.set_result(self._grant(waiter, now))
        if self._waiters:  # a cell waits: no lingering lease may keep it waiting
            for lease in self.leases():
                if lease.lingering is not None:
                    lease.lingering.set()

    def start_lingering(self, lease: Lease) -> asyncio.Event:
        """Keep `lease`, whose cell ended, for its session's next cell; the event is set as soon
        as any cell waits for slots (or at once, if one waits now)."""
        lease.lingering, lease.taken = asyncio.Event(), time.monotonic()
        self._admit()
        return lease.lingering

    def resume(self, lease: Lease) -> None:
        """A lingering lease taken by its session's next cell."""
        _stop_lingering(lease)

    def _admissions(self, now: float, *extra: queueing.LeaseRequest) -> list[int]:
        queue = [queueing.LeaseRequest(w.count, w.since, w.estimate) for w in self._waiters]
        held = [queueing.Holding(len(lease.slots), lease.ends) for lease in self.leases()]
        return queueing.admit(len(self._free), [*queue, *extra], held, now, self.patience)

    def _grant(self, waiter: _Waiter, now: float) -> Lease:
        # preferred slots first, then the least recently used: a slot a parked worker left
        # stays free longest for its return
        free = sorted(self._free, key=lambda slot: slot not in waiter.prefer)
        slots = tuple(sorted(free[:waiter.count]))
        for slot in slots:
            self._free.remove(slot)
        devices = tuple(self.devices[slot].uuid for slot in slots) if self.devices else ()
        ends = None if waiter.estimate is None else now + waiter.estimate
        lease = Lease(waiter.session, slots, now, now - waiter.since, devices,
                      self.threads * len(slots), ends, taken=now)
        for slot in slots:
            self.held[slot] = lease
        return lease

    def release(self, lease: Lease) -> None:
        """Give back all of the lease's slots, and account its slot-seconds."""
        if lease.released is not None:
            return
        _stop_lingering(lease)
        lease.released = time.monotonic()
        self.seconds[lease.session] += lease.held * len(lease.slots)
        self.recent[lease.session].append(lease.held)
        for slot in lease.slots:
            del self.held[slot]
        self._free.extend(lease.slots)
        self._admit()

    def seconds_of(self, session: str) -> float:
        """The session's slot-seconds: its released leases, and those it holds now."""
        held = sum(lease.held * len(lease.slots) for lease in self.leases()
                   if lease.session == session)
        return self.seconds.get(session, 0.0) + held

    def leases(self) -> list[Lease]:
        """The leases held now, each once however many slots it holds."""
        return list({id(lease): lease for lease in self.held.values()}.values())

    def would_wait(self, session: str, count: int = 1) -> bool:
        """Whether `count` slots asked for now would wait (the client tells the user why)."""
        now = time.monotonic()
        asked = queueing.LeaseRequest(count, now, queueing.estimate(self.recent.get(session, ())))
        return len(self._waiters) not in self._admissions(now, asked)

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def status(self) -> LeasesMap:
        now = time.monotonic()
        slots = []
        for slot in range(self.slots):
            entry: SlotMap = {"slot": slot}
            if self.devices:
                gpu = self.devices[slot]
                entry |= {"uuid": gpu.uuid, "name": gpu.name, **gpus.usage(gpu)}
            if (lease := self.held.get(slot)) is not None:
                entry |= {"session": lease.session, "held": lease.held,
                          "with_slots": list(lease.slots),
                          "lingering": lease.lingering is not None}
            slots.append(entry)
        return {"kind": self.kind, "slots": self.slots, "threads": self.threads,
                "held": len(self.held),
                "queued": self.queued, "leases": slots,
                "queue": [{"session": w.session, "waiting": now - w.since, "slots": w.count}
                          for w in self._waiters]}


class SlotMap(gpus.GpuUsage, total=False):
    """One slot in `Leases.status`: its GPU, if any, and the lease holding it, if any."""

    slot: int
    uuid: str
    name: str
    session: str
    held: float  # seconds
    with_slots: list[int]  # every slot of that lease
    lingering: bool


class WaiterMap(TypedDict):
    session: str
    waiting: float  # seconds
    slots: int  # asked for together


class LeasesMap(TypedDict):
    """The slots, their leases and the queue, as `status` reports them."""

    kind: str  # gpu or cpu
    slots: int
    threads: int
    held: int  # slots
    queued: int
    leases: list[SlotMap]
    queue: list[WaiterMap]


def _stop_lingering(lease: Lease) -> None:
    """The lease is no longer lingering; whoever awaits its event is woken."""
    if lease.lingering is not None:
        lease.lingering.set()
        lease.lingering = None

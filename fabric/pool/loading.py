"""Getting a session's state into its worker: the loads of its groups and imports, now or
under the cell's lease, with what this host's disk lacks fetched from the far tiers first."""

from __future__ import annotations

import asyncio

from ..errors import LoadFailed, WorkerDied
from ..snapshot import Group, Manifest, Store
from ..worker.messages import Become, Load, Loaded, WorkerNotice
from .cells import EventSink
from .leases import Leases
from .lifecycle import Life
from .pool import WorkerHandle

Lazy = tuple[tuple[Group, frozenset[str]], ...]  # loaded when a branch needs them (`agent._split`)


def _load(groups: list[Group] | tuple[Group, ...], imports: dict[str, str],
          first: Manifest | None, cwd: str, track_writes: bool, lazy: Lazy = ()) -> Load:
    """The load of `groups` and `imports`, and of the `lazy` groups when a branch of the next
    cell needs them; the `first` of a worker sets its directory and the ambient state of that
    version."""
    wire = [(g.blob, list(g.names)) for g in groups]
    later = [(g.blob, list(g.names), sorted(reads)) for g, reads in lazy]
    if first is None:
        return Load(wire, imports, lazy=later, track_writes=track_writes)
    return Load(wire, imports, cwd=cwd, ambient=first.ambient, lazy=later,
                track_writes=track_writes)


class StateLoader:
    """Loads one session's state (from `store`, whose files are in `cwd`) into its workers."""

    def __init__(self, name: str, cwd: str, store: Store, leases: Leases) -> None:
        self.name, self.cwd, self.store, self.leases = name, cwd, store, leases

    async def load_state(self, life: Life, worker: WorkerHandle, groups: list[Group],
                         imports: dict[str, str], first: Manifest | None, events: EventSink,
                         defer: bool = False, starting: bool = False, lazy: Lazy = ()) -> None:
        """Load `groups` and `imports` (`first`: a worker's first load, see `_load`; `lazy`, see
        `agent._split`) now or, with `defer`, under the cell's lease. On a GPU host the groups
        holding CUDA memory wait for the lease: unpickled before it, they would make a CUDA
        context on a GPU no lease grants, whichever one CUDA picked (a lazy one loads in the
        cell, under it). `starting`: the state a replay starts from, whose held-back groups
        load before the replay."""
        later = [g for g in groups if g.device] if self.leases.kind == "gpu" else []
        now = [g for g in groups if g not in later]
        if now or imports or lazy or first is not None:
            await self._load(life, worker, _load(now, imports, first, self.cwd,
                                                 worker.pool.track_writes, lazy), events, defer)
        if later:
            (life.starting if starting else life.deferred).append(
                _load(later, {}, None, self.cwd, worker.pool.track_writes))

    async def _load(self, life: Life, worker: WorkerHandle, message: Load, events: EventSink,
                    defer: bool = False) -> None:
        """Load now, or, on a parked worker (its CUDA calls would block until the lease unparks
        it) or with `defer`, under the cell's lease."""
        if worker.parked or defer:
            life.deferred.append(message)
            return
        life.loading += await self.send(worker, message, events)

    async def send(self, worker: WorkerHandle, message: Load | Become, events: EventSink) -> float:
        """Send a load (or become) and wait for it; the seconds the worker spent loading. What
        this host's disk lacks of it comes from the remote tier first (workers never reach it)."""
        if isinstance(message, Load):
            await self.fetch([b for b, _ in message.groups] + [b for b, _, _ in message.lazy]
                             + [message.ambient or ""])
        await worker.send(message)
        reply = await worker.recv()
        while isinstance(reply, WorkerNotice):  # a long load's progress, before any cell runs
            events.notice(reply.topic, reply.text)
            reply = await worker.recv()
        if not isinstance(reply, Loaded):
            raise WorkerDied(f"worker {worker.pid} answered a load with {reply.op!r}")
        if reply.error:
            raise LoadFailed(f"could not load the session's state: {reply.error}",
                             session=self.name, traceback=reply.traceback)
        return reply.seconds

    async def fetch(self, blobs: list[str]) -> None:
        """Copy `blobs` from a peer host or the remote tier where this host's disk lacks them
        (off the loop)."""
        if self.store.far and (wanted := [b for b in blobs if b]):
            await asyncio.to_thread(self.store.fetch, wanted)

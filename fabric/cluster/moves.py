"""Where a cluster's sessions go, and their moves between hosts (the door's).

Each cell is placed by the one policy (`placement`) on the views of the hosts and the bytes of
its closure each holds; a cell no host can take waits its turn, first come first served. A
session moves by closing on its host (its commits are in the store every host reads) and opening
on the chosen one, carrying the worker that alone held its unsaveable values (`Emigrate`,
`Immigrate`). Drains and hosts short of memory move sessions the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from random import Random

from ..errors import FabricError, HostLost, UnknownHost
from ..host.face import Caller
from ..messages import Close, Drained, Emigrate, Holds, Immigrate, Moved, Placement, Queued
from .membership import Member, Membership, Reach
from .metrics import DoorMetrics
from .opened import Key, Opened
from .placement import Decision, place, place_randomly

log = logging.getLogger(__name__)


class Moves:
    """The door's placements: where each session goes, and its moves between hosts."""

    def __init__(self, membership: Membership, sessions: dict[Key, Opened], host: Reach,
                 owner: str, tell: Callable[[bytes, dict], None], metrics: DoorMetrics,
                 oversubscribe: int, random: Random | None) -> None:
        self.membership = membership
        self.sessions = sessions  # the door's, by (user, session)
        self.host = host
        self.owner = owner  # the user the door calls hosts as for itself
        self.tell = tell  # sends a client (by identity) a frame before its reply
        self.metrics = metrics
        self.oversubscribe = oversubscribe
        self.random = random  # placing at random (`placement = "random"`), else by locality
        self.waiting: deque[asyncio.Future] = deque()  # cells no host can take yet, in order

    async def where(self, identity: bytes, key: Key, source: str, msg_id: str) -> Decision:
        """Where the session's next cell runs; a cell no host can take now waits its turn."""
        told, since = False, time.monotonic()
        while True:
            decision = await self.place(identity, key, source)
            if decision.host is not None:
                self.metrics.queue_wait.observe(time.monotonic() - since)
                return decision
            if not told:
                slots = sum(h.slots for h in self.membership.alive())
                self.tell(identity, Queued(len(self.waiting), slots).to_wire(msg_id))
                told = True
            turn = asyncio.get_running_loop().create_future()
            self.waiting.append(turn)
            await turn

    def freed(self) -> None:
        """A lease came back somewhere: the first cell waiting for one tries again."""
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return

    async def place(self, identity: bytes, key: Key, source: str, lease: bool = True,
                    avoid: frozenset[str] | set[str] = frozenset()) -> Decision:
        """Where the session goes; `lease`: for a cell that runs now, on a host with a free
        lease (else for a session that opens, on a host that takes it); not to `avoid`."""
        opened = self.sessions[key]
        hosts = self.membership.alive()
        short = {h.name for h in hosts if h.pressed}
        if not lease and any(not h.draining and h.name not in short for h in hosts):
            avoid = {*avoid, *short}  # a session goes to a host short of memory only if it must
        views = [self.membership.view(h, h.name in avoid) for h in hosts]
        current = opened.host
        if self.random is not None:
            return place_randomly(views, current, self.random, self.oversubscribe, lease)
        held: dict[str, int] = {}
        here = self.membership.hosts.get(current) if current else None
        if here is None or not here.alive or here.draining or here.running >= here.slots:
            held = await self._held(identity, key, source, hosts)
        return place(views, current, held, self.oversubscribe, lease)

    async def _held(self, identity: bytes, key: Key, source: str,
                    hosts: list[Member]) -> dict[str, int]:
        """Bytes of the closure each host holds (a host that cannot say counts as none)."""
        ask, caller = Holds(key[1], source), Caller(key[0])

        async def one(host: Member) -> int:
            held = await self.host(identity, key[0], host).holds(caller, ask)
            return held.bytes + held.memory

        found = await asyncio.gather(*(one(h) for h in hosts), return_exceptions=True)
        return {h.name: n for h, n in zip(hosts, found, strict=True) if isinstance(n, int)}

    def bind(self, key: Key, decision: Decision) -> None:
        opened = self.sessions[key]
        opened.host = opened.placed = decision.host
        self.metrics.placements.labels(decision.reason).inc()
        opened.placement = Placement(decision.reason, decision.held, decision.describe())

    async def host_of(self, key: Key) -> Member:
        """The host the session is open on; where it was lost, another one, opened there."""
        opened, hosts = self.sessions[key], self.membership.hosts
        host = hosts.get(opened.host) if opened.host else None
        if host is not None and host.alive:
            return host
        decision = await self.place(b"", key, "", lease=False)
        if decision.host is None:
            raise HostLost(f"no host can take session {key[1]} now", session=key[1])
        await self.move(key, decision)
        return hosts[decision.host]

    async def move(self, key: Key, decision: Decision) -> None:
        """Close the session on its host (its commits are on the remote) and open it on the
        host `decision` chose, with the worker that alone held unsaveable values, if any."""
        hosts = self.membership.hosts
        assert decision.host is not None
        opened, target = self.sessions[key], hosts[decision.host]
        image = None
        if opened.host is not None and hosts[opened.host].alive:
            image = await self._leave(key, hosts[opened.host], target)
        lost = opened.host is None and opened.placed is not None
        try:
            status = await self.host(b"", key[0], target).open(Caller(key[0]), opened.request)
        except FabricError as exc:
            opened.host = None
            raise HostLost(f"session {key[1]} could not open on host {decision.host}: "
                           f"{exc.message}", session=key[1], host=decision.host) from None
        self.reopened(key, lost, status.version)
        if image is not None:
            await self._carry(key, target, image)
        self.bind(key, decision)
        self.metrics.moves.inc()
        log.info("session %s moved to host %s (%s)", key[1], decision.host, decision.reason)

    def reopened(self, key: Key, lost: bool, version: int) -> None:
        """The session is open again, at `version`: if it was `lost` with its host, and that
        host committed past the version the door last heard of before it was cut off, the
        session's next cell is told that version is kept (before `bind` names the new host)."""
        opened = self.sessions[key]
        if lost and version > opened.version:
            opened.kept = (f"version {version} of session {key[1]}, which host "
                           f"{opened.placed} committed before it was lost, is kept: the "
                           "session goes on from it")
            log.warning("session %s: %s", key[1], opened.kept)
        opened.version = version

    async def _leave(self, key: Key, source: Member, target: Member) -> dict | None:
        """Close the session on `source` for `target`; the image of its pinned worker, dumped
        to wake on `target`, if it had one."""
        if not target.wake_dir:  # it joined since the last look
            await self.membership.ping(target)
        try:
            if target.wake_dir:
                owner = self.owner
                left = await self.host(b"", owner, source).emigrate(
                    Caller(owner), Emigrate(key[1], key[0], target.wake_dir))
                image = left.image
            else:  # unanswered: its values are recomputed, or reported lost
                left = await self.host(b"", key[0], source).close(Caller(key[0]), Close(key[1]))
                image = None
        except FabricError:
            self.sessions[key].leased[source.name] = 0.0
            return None
        self.sessions[key].leased[source.name] = left.lease_seconds
        return image

    async def _carry(self, key: Key, target: Member, image: dict) -> None:
        """Restore the carried worker `image` into the session, now open on `target`."""
        try:
            arrived = await self.host(b"", self.owner, target).immigrate(
                Caller(self.owner), Immigrate(key[1], key[0], image))
            why = arrived.why
        except FabricError as exc:
            arrived, why = None, exc.message
        self.metrics.carried.labels("arrived" if arrived and arrived.arrived
                                    else "refused").inc()
        if not (arrived and arrived.arrived):
            log.warning("session %s moved to host %s without its pinned worker: %s", key[1],
                        target.name, why)

    async def drain(self, name: str, undo: bool = False) -> Drained:
        """Open no new session on host `name` and move its sessions off it; `undo`: let it
        take sessions again."""
        host = self.membership.hosts.get(name)
        if host is None:
            raise UnknownHost(f"no host {name!r}; `llfabric status` lists them", host=name)
        host.draining = not undo
        if undo:
            self.freed()
            return Drained(name, ())
        moved = []
        for key, opened in list(self.sessions.items()):
            if opened.host != name:
                continue
            while opened.running and opened.host == name:  # it finishes where it runs
                await asyncio.sleep(0.1)
            async with opened.turn:
                if opened.running or self.sessions.get(key) is not opened \
                        or opened.host != name:
                    continue  # a cell started or moved it meanwhile, or it closed
                decision = await self.place(b"", key, "", lease=False)
                if decision.host is None or decision.host == name:
                    continue  # nowhere else to go: it stays until a host takes it
                await self.move(key, decision)
            moved.append(Moved(key[1], decision.host))
        return Drained(name, tuple(moved))

    async def relieve(self, host: Member) -> None:
        """Move the idle session whose worker holds the most memory off `host`, short of memory
        for `PRESSED` looks, to a host that is not (one a look, until it is not)."""
        idle = [(memory, key) for key, memory in host.holding.items()
                if (o := self.sessions.get(key)) is not None and o.host == host.name
                and not o.running and not o.turn.locked()]
        if not idle:
            return
        _, key = max(idle)
        opened, host.relieving = self.sessions[key], True
        try:
            async with opened.turn:
                if opened.running or opened.host != host.name:
                    return  # a cell took it meanwhile
                decision = await self.place(b"", key, "", lease=False, avoid={host.name})
                if decision.host is None:
                    return  # every other host is full or draining
                await self.move(key, decision)
            host.holding.pop(key, None)
            self.metrics.relieved.inc()
            log.info("host %s is short of memory: session %s moved to host %s", host.name,
                     key[1], decision.host)
        except FabricError as exc:
            log.warning("could not move session %s off host %s, short of memory: %s", key[1],
                        host.name, exc.message)
        finally:
            host.relieving = False

"""The hosts of a cluster as its front door keeps them: which nodes have one, which answer.

Every `HEALTH_EVERY` seconds the door lists the cluster's nodes, starts a host on each node that
has none (`members.RayMembers`), pings each host, and loses one whose node left or whose server
missed `MISSES` pings in a row: the requests it was serving fail with `host_lost`. A host short
of memory for `PRESSED` pings has its largest idle session moved off it; the autoscaler is asked
for what the queue needs, and a host idle past `idle_release` is given back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import FabricError, HostLost
from ..host.face import Caller
from ..messages import Execute, Ping, Request
from .host import HostInfo, host_name
from .placement import HostView
from .scaling import HEAD, demand

if TYPE_CHECKING:
    from .door import Door

log = logging.getLogger(__name__)

HEALTH_EVERY = 1.0  # seconds between the door's looks at its hosts
MISSES = 5  # pings a host leaves unanswered in a row before it is lost
PRESSED = 3  # pings in a row that find a host short of memory before sessions move off it
START_RETRY = 10.0  # seconds before a node whose host did not start is tried again
Key = tuple[str, str]  # (user, session)


@dataclass
class Member:
    """One host of the cluster, as the door sees it."""

    name: str
    node: str
    address: str
    server_key: str
    slots: int
    peer_address: str  # where its blobs are read (`fabric.cluster.peers`)
    peer_key: str
    metrics: str  # HOST:PORT where Prometheus scrapes its server
    running: int = 0  # cells the door carries to it now
    draining: bool = False
    alive: bool = True
    misses: int = 0
    head: bool = False  # on the Ray head node: never released
    gpus: bool = False
    idle_since: float | None = None  # no session, no cell, since then
    wake_dir: str = ""  # where its server wakes a worker carried to it (its pings say)
    pressed: int = 0  # pings in a row that found it short of memory
    holding: dict[Key, int] = field(default_factory=dict)  # pressed: memory by session
    relieving: bool = False


class Membership:
    """The door's hosts: started, watched, lost, released."""

    def __init__(self, door: Door) -> None:
        self.door = door
        self.hosts: dict[str, Member] = {}  # by name
        self.starts: dict[str, asyncio.Task] = {}  # hosts starting, by node
        self.released: set[str] = set()  # nodes whose idle hosts the door stopped
        self._asked: list[dict] = []  # what the autoscaler was last asked for

    def alive(self) -> list[Member]:
        return [h for h in self.hosts.values() if h.alive]

    def any(self) -> Member:
        """The least loaded host, for a request any host's store answers."""
        hosts = self.alive()
        if not hosts:
            raise HostLost("no host of the cluster is up")
        return min(hosts, key=lambda h: h.running / h.slots)

    def view(self, host: Member, avoided: bool = False) -> HostView:
        sessions = sum(1 for s in self.door.sessions.values() if s.host == host.name)
        return HostView(host.name, host.slots, host.running, sessions, host.draining or avoided)

    def table(self) -> list[dict]:
        """The hosts, as `status` lists them (and the metrics read them)."""
        return [{"name": h.name, "node": h.node, "address": h.address, "slots": h.slots,
                 "running": h.running, "alive": h.alive, "draining": h.draining,
                 "metrics": h.metrics,
                 "sessions": sum(1 for s in list(self.door.sessions.values())
                                 if s.host == h.name)}
                for h in list(self.hosts.values())]

    async def look(self) -> None:
        """Start a host on each node that has none; lose the hosts whose nodes left."""
        members = self.door.members
        if members is None:
            return
        nodes = await asyncio.to_thread(members.nodes)
        for host in list(self.hosts.values()):
            if host.node not in nodes and host.alive:
                self.lose(host, "its node left the cluster")
            elif host.node not in nodes and host.node in self.released:  # taken back
                del self.hosts[host.name]
                self.released.discard(host.node)
        if self.door.moves.waiting:  # released nodes the autoscaler kept: take them back
            self.released.clear()
        for node, resources in nodes.items():
            known = next((h for h in self.hosts.values() if h.node == node), None)
            if (known is None or not known.alive) and node not in self.starts \
                    and node not in self.released:
                self.starts[node] = self.door.spawn(self._start(node, resources))

    async def _start(self, node: str, resources: dict) -> None:
        """The node's host actor and server, started (a node that fails is tried again at the
        next look, `START_RETRY` seconds on)."""
        door = self.door
        assert door.members is not None
        users = {user: pair[0] for user, pair in door.keys.items()}
        try:
            info = await asyncio.to_thread(door.members.start, node, resources, users,
                                           door.key, door.peer_pair)
        except FabricError as exc:
            log.warning("node %s has no host: %s", host_name(node), exc.message)
            await asyncio.sleep(START_RETRY)
            return
        finally:
            self.starts.pop(node, None)
        host = self._join(info)
        host.head, host.gpus = HEAD in resources, bool(resources.get("GPU"))
        await self.share_peers()

    async def share_peers(self) -> None:
        """Tell every host the others, whose blobs it reads before the remote tier's."""
        door, hosts = self.door, self.alive()
        assert door.members is not None
        await asyncio.gather(*(asyncio.to_thread(
            door.members.share, h.node,
            [{"name": o.name, "address": o.peer_address, "server_key": o.peer_key}
             for o in hosts if o is not h], door.peer_pair) for h in hosts),
            return_exceptions=True)

    def _join(self, info: HostInfo) -> Member:
        old = self.hosts.get(info["name"])
        host = self.hosts[info["name"]] = Member(
            info["name"], info["node"], info["address"], info["server_key"],
            max(1, info["slots"]), info["peer_address"], info["peer_key"], info["metrics"])
        if old is not None:
            host.draining = old.draining
        log.info("host %s joined: %s, %d slots", host.name, host.address, host.slots)
        self.door.moves.freed()
        return host

    async def watch(self) -> None:
        """Every `HEALTH_EVERY` seconds: the cluster's nodes, each host's answer to a ping."""
        while True:
            await asyncio.sleep(HEALTH_EVERY)
            try:
                await self.look()
            except Exception:
                log.exception("could not list the cluster's nodes")
            await asyncio.gather(*(self.ping(h) for h in self.alive()))
            self.door.forget_gone()
            for host in self.hosts.values():
                if host.alive and host.pressed >= PRESSED and not host.relieving:
                    self.door.spawn(self.door.moves.relieve(host))
            if self.door.members is not None:
                await self._scale()

    async def _scale(self) -> None:
        """Ask the autoscaler for what the queue needs; release hosts idle too long."""
        door, hosts = self.door, self.alive()
        assert door.members is not None
        wanted = demand(sum(h.running for h in hosts), len(door.moves.waiting),
                        any(h.gpus for h in hosts))
        if wanted != self._asked:
            await asyncio.to_thread(door.members.request, wanted)
            self._asked = wanted
        now, idle_release = time.monotonic(), door.config.idle_release
        for host in hosts:
            busy = host.running or any(s.host == host.name for s in door.sessions.values())
            if busy or host.head:
                host.idle_since = None
            elif host.idle_since is None:
                host.idle_since = now
            elif idle_release and now - host.idle_since >= idle_release:
                await self._release(host)

    async def _release(self, host: Member) -> None:
        """Stop an idle host's actor, so that the autoscaler may take its node back."""
        assert self.door.members is not None
        log.info("host %s idle for %d s: released", host.name, self.door.config.idle_release)
        host.alive = False
        self.released.add(host.node)
        try:
            await asyncio.to_thread(self.door.members.stop, host.node)
        except FabricError as exc:
            log.warning("host %s could not be released: %s", host.name, exc.message)
        self.lose(host, "released: idle")

    async def ping(self, host: Member) -> None:
        door = self.door
        try:
            pong = await asyncio.wait_for(
                door.host(b"", door.owner, host).ping(Caller(door.owner), Ping()),
                HEALTH_EVERY * 2)
        except TimeoutError:
            host.misses += 1
        except FabricError:
            host.misses += 1
        else:
            host.misses = 0
            host.wake_dir = pong.wake_dir or host.wake_dir
            host.pressed = host.pressed + 1 if pong.pressure is True else 0
            host.holding = {(u, s): m for u, s, m in pong.holding or ()} if host.pressed \
                else {}
        if host.misses >= MISSES and host.alive:
            self.lose(host, f"its server did not answer {MISSES} pings")

    def lose(self, host: Member, why: str) -> None:
        """The host is gone: what it served fails as lost, its sessions open elsewhere next."""
        door = self.door
        log.warning("host %s is lost: %s", host.name, why)
        door.metrics.hosts_lost.labels("released" if host.node in self.released
                                       else "lost").inc()
        host.alive, host.running = False, 0
        for (identity, name), link in list(door.links.items()):
            if name == host.name:
                link.fail(lambda request, u=link.user: self.lost_error(host, request, u))
                link.close()
                del door.links[(identity, name)]
        for opened in door.sessions.values():
            if opened.host == host.name:
                opened.host = None
        door.moves.freed()
        door.spawn(self.share_peers())  # its peers stop asking it

    def lost_error(self, host: Member, request: Request, user: str) -> HostLost:
        session = getattr(request, "session", None)
        opened = self.door.sessions.get((user, session)) if session else None
        if isinstance(request, Execute) and opened is not None:
            return HostLost(
                f"host {host.name} was lost while it ran this cell; session {session} stays "
                f"at version {opened.version}, its last commit, and its next cell runs on "
                "another host", host=host.name, session=session, version=opened.version)
        return HostLost(f"host {host.name} was lost", host=host.name)

"""The hosts of a cluster as its front door keeps them: which nodes have one, which answer.

Every `HEALTH_EVERY` seconds the door lists the cluster's nodes, starts a host on each node that
has none (`members.RayMembers`), pings each host, and loses one whose node left or whose server
missed `MISSES` pings in a row: the requests it was serving fail with `host_lost`, and its
sessions open elsewhere next. A lost host whose node is still there (paused, or cut off) is
taken back only once it answers and has given up every session it had (`GiveUp`): from then on
it serves none of them unless the door opens one on it again. What it committed meanwhile the
head's compare-and-set settles: kept if no other host moved the head first, else refused.
A host short of memory for `PRESSED` pings has its largest idle session moved off it; the
autoscaler is asked for what the queue needs, and a host idle past `idle_release` is given back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ..errors import FabricError, HostLost
from ..host.face import Caller
from ..messages import Execute, GiveUp, Ping, Request
from ..tasks import within
from .host import HostInfo, host_name
from .link import Link
from .members import Members
from .metrics import DoorMetrics
from .opened import Key, Opened
from .placement import HostView
from .remote import RemoteHost
from .scaling import HEAD, demand

log = logging.getLogger(__name__)

HEALTH_EVERY = 1.0  # seconds between the door's looks at its hosts
MISSES = 5  # pings a host leaves unanswered in a row before it is lost
PRESSED = 3  # pings in a row that find a host short of memory before sessions move off it
START_RETRY = 10.0  # seconds before a node whose host did not start is tried again
GIVE_UP_TIMEOUT = 60.0  # seconds a host that is back may take to close its sessions


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


# a host, called over the link of a client (by identity; b"": the door's own) as a user
Reach = Callable[[bytes, str, Member], RemoteHost]


class Membership:
    """The door's hosts: started, watched, lost, released."""

    def __init__(self, members: Members | None, sessions: dict[Key, Opened],
                 links: dict[tuple[bytes, str], Link], host: Reach, owner: str,
                 keys: dict[str, tuple[str, str]], key: bytes, peer_pair: tuple[str, str],
                 metrics: DoorMetrics, idle_release: float,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
                 waiting: Callable[[], int], freed: Callable[[], None]) -> None:
        self.members = members  # the cluster's nodes (None: hosts join by themselves)
        self.sessions = sessions  # the door's, by (user, session)
        self.links = links  # the door's, by (client identity, host name)
        self.host = host
        self.owner = owner  # the user the door calls hosts as for itself
        self.keys = keys  # user -> the key pair hosts admit them by
        self.key = key  # the key every host's store signs with
        self.peer_pair = peer_pair  # the key pair hosts read each other's blobs with
        self.metrics = metrics
        self.idle_release = idle_release
        self.spawn = spawn  # runs a task the door owns
        self.waiting = waiting  # how many cells wait for a lease (`moves.Moves`)
        self.freed = freed  # a lease may be free: the first cell waiting tries again
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
        sessions = sum(1 for s in self.sessions.values() if s.host == host.name)
        return HostView(host.name, host.slots, host.running, sessions, host.draining or avoided)

    def table(self) -> list[dict]:
        """The hosts, as `status` lists them (and the metrics read them)."""
        return [{"name": h.name, "node": h.node, "address": h.address, "slots": h.slots,
                 "running": h.running, "alive": h.alive, "draining": h.draining,
                 "metrics": h.metrics,
                 "sessions": sum(1 for s in list(self.sessions.values())
                                 if s.host == h.name)}
                for h in list(self.hosts.values())]

    async def look(self) -> None:
        """Start a host on each node that has none; lose the hosts whose nodes left."""
        members = self.members
        if members is None:
            return
        nodes = await asyncio.to_thread(members.nodes)
        for host in list(self.hosts.values()):
            if host.node not in nodes and host.alive:
                self.lose(host, "its node left the cluster")
            elif host.node not in nodes and host.node in self.released:  # taken back
                del self.hosts[host.name]
                self.released.discard(host.node)
        if self.waiting():  # released nodes the autoscaler kept: take them back
            self.released.clear()
        for node, resources in nodes.items():
            known = next((h for h in self.hosts.values() if h.node == node), None)
            if (known is None or not known.alive) and node not in self.starts \
                    and node not in self.released:
                self.starts[node] = self.spawn(self._start(node, resources))

    async def _start(self, node: str, resources: dict) -> None:
        """The node's host actor and server, started (a node that fails is tried again at the
        next look, `START_RETRY` seconds on)."""
        assert self.members is not None
        users = {user: pair[0] for user, pair in self.keys.items()}
        try:
            info = await asyncio.to_thread(self.members.start, node, resources, users,
                                           self.key, self.peer_pair)
            known = self.hosts.get(info["name"])
            if known is not None and not known.alive and not await self._given_up(info):
                return  # still silent (paused, cut off): asked again at the next look
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
        hosts = self.alive()
        assert self.members is not None
        await asyncio.gather(*(asyncio.to_thread(
            self.members.share, h.node,
            [{"name": o.name, "address": o.peer_address, "server_key": o.peer_key}
             for o in hosts if o is not h], self.peer_pair) for h in hosts),
            return_exceptions=True)

    async def _given_up(self, info: HostInfo) -> bool:
        """Whether a host the door lost, back (its server resumed, or reached again), answers
        and has closed every session it had open: the door moved them, or opens them on it
        again from the store, and nothing it kept from before serves them."""
        back = _member(info)
        reach = self.host(b"", self.owner, back)
        try:
            await within(reach.ping(Caller(self.owner), Ping()), HEALTH_EVERY * 2)
            given = await within(reach.give_up(Caller(self.owner), GiveUp()),
                                 GIVE_UP_TIMEOUT)
        except (TimeoutError, FabricError):
            link = self.links.pop((b"", back.name), None)
            if link is not None:  # the next try connects afresh
                link.close()
            return False
        log.warning("host %s is back: it gave up %d sessions it had when it was lost",
                    back.name, len(given.given_up))
        return True

    def _join(self, info: HostInfo) -> Member:
        old = self.hosts.get(info["name"])
        host = self.hosts[info["name"]] = _member(info)
        if old is not None:
            host.draining = old.draining
        log.info("host %s joined: %s, %d slots", host.name, host.address, host.slots)
        self.freed()
        return host

    async def check(self) -> None:
        """The cluster's nodes looked at, and each host's answer to a ping."""
        try:
            await self.look()
        except Exception:
            log.exception("could not list the cluster's nodes")
        await asyncio.gather(*(self.ping(h) for h in self.alive()))

    def pressed(self) -> list[Member]:
        """The hosts short of memory for `PRESSED` pings that no session is moving off yet."""
        return [h for h in self.hosts.values()
                if h.alive and h.pressed >= PRESSED and not h.relieving]

    async def scale(self) -> None:
        """Ask the autoscaler for what the queue needs; release hosts idle too long."""
        hosts = self.alive()
        assert self.members is not None
        wanted = demand(sum(h.running for h in hosts), self.waiting(),
                        any(h.gpus for h in hosts))
        if wanted != self._asked:
            await asyncio.to_thread(self.members.request, wanted)
            self._asked = wanted
        now, idle_release = time.monotonic(), self.idle_release
        for host in hosts:
            busy = host.running or any(s.host == host.name for s in self.sessions.values())
            if busy or host.head:
                host.idle_since = None
            elif host.idle_since is None:
                host.idle_since = now
            elif idle_release and now - host.idle_since >= idle_release:
                await self._release(host)

    async def _release(self, host: Member) -> None:
        """Stop an idle host's actor, so that the autoscaler may take its node back."""
        assert self.members is not None
        log.info("host %s idle for %d s: released", host.name, self.idle_release)
        host.alive = False
        self.released.add(host.node)
        try:
            await asyncio.to_thread(self.members.stop, host.node)
        except FabricError as exc:
            log.warning("host %s could not be released: %s", host.name, exc.message)
        self.lose(host, "released: idle")

    async def ping(self, host: Member) -> None:
        try:
            pong = await within(
                self.host(b"", self.owner, host).ping(Caller(self.owner), Ping()),
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
        log.warning("host %s is lost: %s", host.name, why)
        self.metrics.hosts_lost.labels("released" if host.node in self.released
                                       else "lost").inc()
        host.alive, host.running = False, 0
        for (identity, name), link in list(self.links.items()):
            if name == host.name:
                link.fail(lambda request, u=link.user: self.lost_error(host, request, u))
                link.close()
                del self.links[(identity, name)]
        for opened in self.sessions.values():
            if opened.host == host.name:
                opened.host = None
        self.freed()
        self.spawn(self.share_peers())  # its peers stop asking it

    def lost_error(self, host: Member, request: Request, user: str) -> HostLost:
        session = getattr(request, "session", None)
        opened = self.sessions.get((user, session)) if session else None
        if isinstance(request, Execute) and opened is not None:
            return HostLost(
                f"host {host.name} was lost while it ran this cell; session {session} stays "
                f"at version {opened.version}, its last commit, and its next cell runs on "
                "another host (if this cell committed on the lost host before it was cut "
                "off, that version is kept, and the next cell says so)", host=host.name,
                session=session, version=opened.version)
        return HostLost(f"host {host.name} was lost", host=host.name)


def _member(info: HostInfo) -> Member:
    return Member(info["name"], info["node"], info["address"], info["server_key"],
                  max(1, info["slots"]), info["peer_address"], info["peer_key"], info["metrics"])

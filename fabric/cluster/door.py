"""`llfabric serve --ray`: one front door for the hosts of a Ray cluster.

Clients speak the protocol they speak to one host (`fabric.messages`), with the same address
rules and keys (`fabric.front`); the door places each session on a host (`placement`) and carries
its requests there. Each client reaches each host over a connection of its own (`link.Link`),
admitted on the host as that client's user with a key the door made for them: the host keeps
its users' sessions apart, and sees a client that goes away as gone, exactly as if it had
connected itself.
The door reads only what it needs of the frames it carries: the final frame of each request.

Sessions move between hosts through the store: a host reads the state it lacks from the peer
that has it, else from the remote tier, where every commit is before its cell is reported done
(without a remote, on `copies` hosts); a host that opens a session takes the newest head (the
remote's, else its peers'). A session is open on one host at a time, so its head has one writer.
A worker that alone holds values that could not be saved moves with its session (`Emigrate`).
When a host is lost (its node gone, its server silent), the requests it was serving fail with
`host_lost`, naming the version the session stays at, and the session's next request opens it
on another host; values only that host's worker held are rebuilt there from their lineage, or
reported lost.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import signal
import time
from collections import deque
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from .. import auth
from ..auth import ClientKey
from ..config import Config
from ..errors import (
    ConfigError,
    FabricError,
    Forbidden,
    HostLost,
    SessionBusy,
    UnknownHost,
    UnknownSession,
)
from ..front import Front, failure, msg_id_of
from ..messages import (
    Close,
    Drain,
    Drained,
    Emigrate,
    Error,
    Execute,
    Holds,
    Immigrate,
    Open,
    Ping,
    Pong,
    Queued,
    Remove,
    Request,
    Status,
)
from ..metrics import serve as serve_metrics
from ..private import private_dir
from ..snapshot.store import load_key
from ..status import ServerStatus
from .host import host_name
from .link import Link
from .members import RayMembers
from .metrics import DoorMetrics
from .placement import OVERSUBSCRIBE, POLICIES, Decision, HostView, place, place_randomly
from .scaling import HEAD, demand

log = logging.getLogger(__name__)

HEALTH_EVERY = 1.0  # seconds between the door's looks at its hosts
MISSES = 5  # pings a host leaves unanswered in a row before it is lost
PRESSED = 3  # pings in a row that find a host short of memory before sessions move off it
START_RETRY = 10.0  # seconds before a node whose host did not start is tried again
STORE_OPS = frozenset({"tag", "history", "versions", "holds"})  # served by any host's store
Key = tuple[str, str]  # (user, session)


@dataclass
class Host:
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


@dataclass
class Opened:
    """A session as the door knows it: how it was opened, where, its last version."""

    request: Open
    host: str | None = None
    version: int = 0
    running: bool = False
    placement: dict = field(default_factory=dict)
    # slot-seconds it leased on each host it left (a host counts on if it comes back)
    leased: dict[str, float] = field(default_factory=dict)
    # held while a cell is placed (and the session moved for it), while it closes, and while a
    # drain moves it: one of them at a time decides where it is
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)


class Door:
    def __init__(self, config: Config, members: RayMembers | None = None) -> None:
        if not config.remote and (config.copies < 2 or config.users == "separate"):
            raise ConfigError(
                "a cluster without a remote tier (`remote`, an fsspec URL every host reaches) "
                "keeps each commit on `copies` hosts, at least 2; and serving separate users, it "
                "needs the remote: their parts of the store are not shared between hosts",
                key="remote")
        self.config = config
        # its claim, the hosts' folders on this node, and the key every host's store signs with
        self.key = load_key(private_dir(config.store) / "key")
        self.peer_pair = tuple(k.decode() for k in zmq.curve_keypair())  # hosts read each other
        self.metrics = DoorMetrics(self._host_table)
        self.front = Front(config, lambda: self.metrics.auth_failures.inc())
        self.members = members
        self.owner = auth.owner_name()
        self.hosts: dict[str, Host] = {}  # by name
        self.sessions: dict[Key, Opened] = {}
        self.links: dict[tuple[bytes, str], Link] = {}
        self.keys: dict[str, tuple[str, str]] = {}  # user -> the key pair hosts admit them by
        self.waiting: deque[asyncio.Future] = deque()  # cells no host can take yet, in order
        self.oversubscribe = config.oversubscribe or OVERSUBSCRIBE
        if config.placement not in POLICIES:
            raise ConfigError(f"placement is locality or random, not {config.placement!r}",
                              key="placement")
        self.random = random.Random() if config.placement == "random" else None
        self.context = zmq.asyncio.Context()
        self.started = time.time()
        self._ids = (f"door-{n}" for n in itertools.count(1))
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._starts: dict[str, asyncio.Task] = {}  # host agents starting, by node
        self.released: set[str] = set()  # nodes whose idle hosts the door stopped
        self._asked: list[dict] = []  # what the autoscaler was last asked for

    # serving
    async def serve(self, ready: asyncio.Event | None = None) -> None:
        async with self.front.bound():
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
            await self._key_of(self.owner)
            await self._look()
            await asyncio.gather(*self._starts.values())
            metrics = serve_metrics(self.metrics.registry, self.config.metrics_bind) \
                if self.config.metrics_bind else None
            log.info("front door on %s: %d hosts", self.config.address, len(self.hosts))
            if ready is not None:
                ready.set()
            workers = [asyncio.ensure_future(c) for c in (self._receive(), self._watch())]
            try:
                await self._stop.wait()
            finally:
                for task in (*workers, *self._tasks):
                    task.cancel()
                for link in self.links.values():
                    link.close()
                self.context.term()
                if metrics is not None:
                    metrics.shutdown()
                    metrics.server_close()
                if self.members is not None:
                    await asyncio.to_thread(self.members.close)

    def stop(self) -> None:
        self._stop.set()

    async def _receive(self) -> None:
        while True:
            self._spawn(self._handle(await self.front.receive()))

    def _spawn(self, work) -> asyncio.Task:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _handle(self, frames: list[zmq.Frame]) -> None:
        identity, msg_id = frames[0].bytes, msg_id_of(frames)
        try:
            user, message, request = self.front.read(frames)
            final = await self._dispatch(identity, user, request, message)
        except Exception as exc:  # the client hears of it; the door keeps serving
            final = failure(exc, msg_id)
        self.front.send(identity, final)

    async def _dispatch(self, identity: bytes, user: str, request: Request,
                        message: dict) -> dict:
        msg_id = message["msg_id"]
        match request:
            case Ping():
                return Pong(True, os.getpid(), user).to_wire(msg_id)
            case Status():
                return ServerStatus.from_wire(await self._status(identity, user)).to_wire(msg_id)
            case Drain(host=name, undo=undo):
                if user != self.owner:
                    raise Forbidden(f"only {self.owner}, who runs the cluster, drains hosts",
                                    user=user)
                return Drained.from_wire(await self._drain(name, undo)).to_wire(msg_id)
            case Remove():
                return await self._everywhere(identity, user, request, message)
        key = (user, request.session)
        opened = self.sessions.get(key)
        if isinstance(request, Open):
            return await self._open(identity, key, request, message)
        if opened is None:
            if request.op in STORE_OPS:
                return await self._call(identity, user, self._any_host(), request, message)
            raise UnknownSession(f"no open session {request.session!r}; open it first",
                                 session=request.session)
        if isinstance(request, Execute):
            return await self._execute(identity, key, opened, request, message)
        if isinstance(request, Close):  # not while a cell's placement or a drain moves it
            async with opened.turn:
                final = await self._call(identity, user, await self._host_of(key), request,
                                         message)
                if final.get("type") == "reply":
                    del self.sessions[key]
            return final
        return await self._call(identity, user, await self._host_of(key), request, message)

    # sessions
    async def _open(self, identity: bytes, key: Key, request: Open, message: dict) -> dict:
        new = key not in self.sessions
        opened = self.sessions.setdefault(key, Opened(request))
        opened.request = Open(request.session, request.cwd or opened.request.cwd,
                              request.env if request.env is not None else opened.request.env)
        here = self.hosts.get(opened.host) if opened.host else None
        decision = None
        if here is None or not here.alive:
            decision = await self._place(identity, key, "", lease=False)
            if decision.host is None:
                if new:
                    del self.sessions[key]
                raise HostLost(f"no host can take session {key[1]} now: every host is "
                               "draining or full", session=key[1])
            here = self.hosts[decision.host]
        final = await self._call(identity, key[0], here, request, message)
        if final.get("type") != "reply":
            if new:
                del self.sessions[key]
            return final
        if decision is not None:
            self._bind(key, decision)
        opened.version = int(final.get("version", opened.version))
        return {**final, **opened.placement}

    async def _host_of(self, key: Key) -> Host:
        """The host the session is open on; where it was lost, another one, opened there."""
        opened = self.sessions[key]
        host = self.hosts.get(opened.host) if opened.host else None
        if host is not None and host.alive:
            return host
        decision = await self._place(b"", key, "", lease=False)
        if decision.host is None:
            raise HostLost(f"no host can take session {key[1]} now", session=key[1])
        await self._move(key, decision)
        return self.hosts[decision.host]

    async def _execute(self, identity: bytes, key: Key, opened: Opened, request: Execute,
                       message: dict) -> dict:
        if opened.running:  # the host says so too; placing it first could move the session
            raise SessionBusy(f"session {key[1]} is already running a cell", session=key[1])
        async with opened.turn:
            decision = await self._where(identity, key, request.source, message["msg_id"])
            host = self.hosts[decision.host]
            host.running += 1
            opened.running = True
            try:
                if decision.host != opened.host:
                    await self._move(key, decision)
                else:
                    self._bind(key, decision)
            except BaseException:
                host.running -= 1
                opened.running = False
                self._freed()
                raise
        try:
            final = await self._call(identity, key[0], host, request, message)
        finally:
            host.running -= 1
            opened.running = False
            self._freed()
        if final.get("type") == "reply":
            opened.version = int(final.get("version", opened.version))
            return {**final, **opened.placement}
        return final

    async def _where(self, identity: bytes, key: Key, source: str, msg_id: str) -> Decision:
        """Where the session's next cell runs; a cell no host can take now waits its turn."""
        told, since = False, time.monotonic()
        while True:
            decision = await self._place(identity, key, source)
            if decision.host is not None:
                self.metrics.queue_wait.observe(time.monotonic() - since)
                return decision
            if not told:
                self.front.send(identity, Queued(len(self.waiting), sum(
                    h.slots for h in self.hosts.values() if h.alive)).to_wire(msg_id))
                told = True
            turn = asyncio.get_running_loop().create_future()
            self.waiting.append(turn)
            await turn

    async def _place(self, identity: bytes, key: Key, source: str, lease: bool = True,
                     avoid: frozenset[str] | set[str] = frozenset()) -> Decision:
        """Where the session goes; `lease`: for a cell that runs now, on a host with a free
        lease (else for a session that opens, on a host that takes it); not to `avoid`."""
        opened = self.sessions[key]
        hosts = [h for h in self.hosts.values() if h.alive]
        short = {h.name for h in hosts if h.pressed}
        if not lease and any(not h.draining and h.name not in short for h in hosts):
            avoid = {*avoid, *short}  # a session goes to a host short of memory only if it must
        views = [self._view(h, h.name in avoid) for h in hosts]
        current = opened.host
        if self.random is not None:
            return place_randomly(views, current, self.random, self.oversubscribe, lease)
        held: dict[str, int] = {}
        here = self.hosts.get(current) if current else None
        if here is None or not here.alive or here.draining or here.running >= here.slots:
            held = await self._held(identity, key, source, hosts)
        return place(views, current, held, self.oversubscribe, lease)

    async def _held(self, identity: bytes, key: Key, source: str,
                    hosts: list[Host]) -> dict[str, int]:
        """Bytes of the closure each host holds (a host that cannot say counts as none)."""
        ask = Holds(key[1], source)

        async def one(host: Host) -> int:
            msg_id = next(self._ids)
            final = await self._call(identity, key[0], host, ask, ask.to_wire(msg_id))
            return int(final.get("bytes", 0)) + int(final.get("memory", 0)) \
                if final.get("type") == "reply" else 0

        found = await asyncio.gather(*(one(h) for h in hosts), return_exceptions=True)
        return {h.name: n for h, n in zip(hosts, found, strict=True) if isinstance(n, int)}

    def _bind(self, key: Key, decision: Decision) -> None:
        opened = self.sessions[key]
        opened.host = decision.host
        self.metrics.placements.labels(decision.reason).inc()
        opened.placement = {"host": decision.host,
                            "placement": {"reason": decision.reason, "held": decision.held,
                                          "why": decision.describe()}}

    async def _move(self, key: Key, decision: Decision) -> None:
        """Close the session on its host (its commits are on the remote) and open it on the
        host `decision` chose, with the worker that alone held unsaveable values, if any."""
        opened, target = self.sessions[key], self.hosts[decision.host]
        image = None
        if opened.host is not None and self.hosts[opened.host].alive:
            image = await self._leave(key, self.hosts[opened.host], target)
        request = opened.request
        final = await self._call(b"", key[0], target, request, request.to_wire(next(self._ids)))
        if final.get("type") != "reply":
            opened.host = None
            raise HostLost(f"session {key[1]} could not open on host {decision.host}: "
                           f"{final.get('error', {}).get('message', final)}",
                           session=key[1], host=decision.host)
        if image is not None:
            await self._carry(key, target, image)
        self._bind(key, decision)
        self.metrics.moves.inc()
        log.info("session %s moved to host %s (%s)", key[1], decision.host, decision.reason)

    async def _leave(self, key: Key, source: Host, target: Host) -> dict | None:
        """Close the session on `source` for `target`; the image of its pinned worker, dumped
        to wake on `target`, if it had one."""
        if not target.wake_dir:  # it joined since the last look
            await self._ping(target)
        request: Request = Emigrate(key[1], key[0], target.wake_dir) if target.wake_dir \
            else Close(key[1])  # unanswered: its values are recomputed, or reported lost
        final = await self._call(b"", self.owner if target.wake_dir else key[0], source,
                                 request, request.to_wire(next(self._ids)))
        self.sessions[key].leased[source.name] = float(final.get("lease_seconds", 0.0))
        return final.get("image") if final.get("type") == "reply" else None

    async def _carry(self, key: Key, target: Host, image: dict) -> None:
        """Restore the carried worker `image` into the session, now open on `target`."""
        request = Immigrate(key[1], key[0], image)
        final = await self._call(b"", self.owner, target, request,
                                 request.to_wire(next(self._ids)))
        arrived = final.get("type") == "reply" and final.get("arrived")
        self.metrics.carried.labels("arrived" if arrived else "refused").inc()
        if not arrived:
            log.warning("session %s moved to host %s without its pinned worker: %s", key[1],
                        target.name, final.get("why") or final.get("error", {}).get("message"))

    def _freed(self) -> None:
        """A lease came back somewhere: the first cell waiting for one tries again."""
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return

    async def _everywhere(self, identity: bytes, user: str, request: Request,
                          message: dict) -> dict:
        """A request every host's store answers (`remove`): no host keeps a stale copy."""
        hosts = [h for h in self.hosts.values() if h.alive]
        finals = await asyncio.gather(*(
            self._call(identity, user, h, request, {**message, "msg_id": next(self._ids)})
            for h in hosts))
        self.sessions.pop((user, request.session), None)
        done = next((f for f in finals if f.get("type") == "reply"), finals[0] if finals
                    else Error(HostLost("no host is up").to_wire()).to_wire(None))
        return {**done, "msg_id": message["msg_id"]}

    # carrying requests
    async def _call(self, identity: bytes, user: str, host: Host, request: Request,
                    message: dict) -> dict:
        """`message` on the client's link to `host`; its final frame (an error if the host is
        lost meanwhile)."""
        if not host.alive:
            return Error(self._lost_error(host, request, user).to_wire()).to_wire(
                message["msg_id"])
        link = self.links.get((identity, host.name))
        if link is None:
            public, secret = await self._key_of(user)
            relay = (lambda frame: self.front.send(identity, frame)) if identity else \
                (lambda frame: None)
            link = self.links[(identity, host.name)] = Link(
                self.context, host.name, host.address,
                ClientKey(user, public, secret, host.server_key), relay)
        return await link.call(message, request)

    async def _key_of(self, user: str) -> tuple[str, str]:
        """The key pair the door connects to hosts with as `user` (hosts learn it at once)."""
        if user not in self.keys:
            public, secret = (k.decode() for k in zmq.curve_keypair())
            self.keys[user] = (public, secret)
            if self.members is not None:
                await asyncio.gather(*(
                    asyncio.to_thread(self.members.admit, h.node, user, public)
                    for h in self.hosts.values() if h.alive), return_exceptions=True)
        return self.keys[user]

    def _any_host(self) -> Host:
        hosts = [h for h in self.hosts.values() if h.alive]
        if not hosts:
            raise HostLost("no host of the cluster is up")
        return min(hosts, key=lambda h: h.running / h.slots)

    def _view(self, host: Host, avoided: bool = False) -> HostView:
        sessions = sum(1 for s in self.sessions.values() if s.host == host.name)
        return HostView(host.name, host.slots, host.running, sessions,
                        host.draining or avoided)

    # hosts
    async def _look(self) -> None:
        """Start a host agent on each node that has none; lose the hosts whose nodes left."""
        if self.members is None:
            return
        nodes = await asyncio.to_thread(self.members.nodes)
        for host in list(self.hosts.values()):
            if host.node not in nodes and host.alive:
                self._lose(host, "its node left the cluster")
            elif host.node not in nodes and host.node in self.released:  # taken back
                del self.hosts[host.name]
                self.released.discard(host.node)
        if self.waiting:  # released nodes the autoscaler kept: take them back
            self.released.clear()
        for node, resources in nodes.items():
            known = next((h for h in self.hosts.values() if h.node == node), None)
            if (known is None or not known.alive) and node not in self._starts \
                    and node not in self.released:
                self._starts[node] = self._spawn(self._start(node, resources))

    async def _start(self, node: str, resources: dict) -> None:
        """The node's host agent and server, started (a node that fails is tried again at the
        next look, `START_RETRY` seconds on)."""
        users = {user: pair[0] for user, pair in self.keys.items()}
        try:
            info = await asyncio.to_thread(self.members.start, node, resources, users,
                                           self.key, self.peer_pair)
        except FabricError as exc:
            log.warning("node %s has no host: %s", host_name(node), exc.message)
            await asyncio.sleep(START_RETRY)
            return
        finally:
            self._starts.pop(node, None)
        host = self._join(info)
        host.head, host.gpus = HEAD in resources, bool(resources.get("GPU"))
        await self._share_peers()

    async def _share_peers(self) -> None:
        """Tell every host the others, whose blobs it reads before the remote tier's."""
        hosts = [h for h in self.hosts.values() if h.alive]
        await asyncio.gather(*(asyncio.to_thread(
            self.members.share, h.node,
            [{"name": o.name, "address": o.peer_address, "server_key": o.peer_key}
             for o in hosts if o is not h], self.peer_pair) for h in hosts),
            return_exceptions=True)

    def _join(self, info: dict) -> Host:
        old = self.hosts.get(info["name"])
        host = self.hosts[info["name"]] = Host(
            info["name"], info["node"], info["address"], info["server_key"],
            max(1, info["slots"]), info["peer_address"], info["peer_key"], info["metrics"])
        if old is not None:
            host.draining = old.draining
        log.info("host %s joined: %s, %d slots", host.name, host.address, host.slots)
        self._freed()
        return host

    async def _watch(self) -> None:
        """Every `HEALTH_EVERY` seconds: the cluster's nodes, each host's answer to a ping."""
        while True:
            await asyncio.sleep(HEALTH_EVERY)
            try:
                await self._look()
            except Exception:
                log.exception("could not list the cluster's nodes")
            await asyncio.gather(*(self._ping(h) for h in list(self.hosts.values())
                                   if h.alive))
            self._forget_gone()
            for host in self.hosts.values():
                if host.alive and host.pressed >= PRESSED and not host.relieving:
                    self._spawn(self._relieve(host))
            if self.members is not None:
                await self._scale()

    async def _relieve(self, host: Host) -> None:
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
                decision = await self._place(b"", key, "", lease=False, avoid={host.name})
                if decision.host is None:
                    return  # every other host is full or draining
                await self._move(key, decision)
            host.holding.pop(key, None)
            self.metrics.relieved.inc()
            log.info("host %s is short of memory: session %s moved to host %s", host.name,
                     key[1], decision.host)
        except FabricError as exc:
            log.warning("could not move session %s off host %s, short of memory: %s", key[1],
                        host.name, exc.message)
        finally:
            host.relieving = False

    async def _scale(self) -> None:
        """Ask the autoscaler for what the queue needs; release hosts idle too long."""
        hosts = [h for h in self.hosts.values() if h.alive]
        wanted = demand(sum(h.running for h in hosts), len(self.waiting),
                        any(h.gpus for h in hosts))
        if wanted != self._asked:
            await asyncio.to_thread(self.members.request, wanted)
            self._asked = wanted
        now = time.monotonic()
        for host in hosts:
            busy = host.running or any(s.host == host.name for s in self.sessions.values())
            if busy or host.head:
                host.idle_since = None
            elif host.idle_since is None:
                host.idle_since = now
            elif self.config.idle_release and now - host.idle_since >= self.config.idle_release:
                await self._release(host)

    async def _release(self, host: Host) -> None:
        """Stop an idle host's agent, so that the autoscaler may take its node back."""
        log.info("host %s idle for %d s: released", host.name, self.config.idle_release)
        host.alive = False
        self.released.add(host.node)
        try:
            await asyncio.to_thread(self.members.stop, host.node)
        except FabricError as exc:
            log.warning("host %s could not be released: %s", host.name, exc.message)
        self._lose(host, "released: idle")

    def _forget_gone(self) -> None:
        """Close the links of clients no longer connected: their hosts see them gone (a running
        cell then runs on for the host's `detached_grace`, for a client that follows it)."""
        for identity in {i for i, _ in self.links if i}:
            if not self.front.connected(identity):
                for (i, name), link in list(self.links.items()):
                    if i == identity:
                        link.close()
                        del self.links[(i, name)]

    async def _ping(self, host: Host) -> None:
        ping = Ping()
        try:
            final = await asyncio.wait_for(
                self._call(b"", self.owner, host, ping, ping.to_wire(next(self._ids))),
                HEALTH_EVERY * 2)
            host.misses = 0 if final.get("type") == "reply" else host.misses + 1
            host.wake_dir = final.get("wake_dir", host.wake_dir)
            host.pressed = host.pressed + 1 if final.get("pressure") is True else 0
            host.holding = _holding(final.get("holding")) if host.pressed else {}
        except TimeoutError:
            host.misses += 1
        if host.misses >= MISSES and host.alive:
            self._lose(host, f"its server did not answer {MISSES} pings")

    def _lose(self, host: Host, why: str) -> None:
        """The host is gone: what it served fails as lost, its sessions open elsewhere next."""
        log.warning("host %s is lost: %s", host.name, why)
        self.metrics.hosts_lost.labels("released" if host.node in self.released
                                       else "lost").inc()
        host.alive, host.running = False, 0
        for (identity, name), link in list(self.links.items()):
            if name == host.name:
                link.fail(lambda request, u=link.user: self._lost_error(host, request, u))
                link.close()
                del self.links[(identity, name)]
        for opened in self.sessions.values():
            if opened.host == host.name:
                opened.host = None
        self._freed()
        self._spawn(self._share_peers())  # its peers stop asking it

    def _lost_error(self, host: Host, request: Request, user: str) -> HostLost:
        session = getattr(request, "session", None)
        opened = self.sessions.get((user, session)) if session else None
        if isinstance(request, Execute) and opened is not None:
            return HostLost(
                f"host {host.name} was lost while it ran this cell; session {session} stays "
                f"at version {opened.version}, its last commit, and its next cell runs on "
                "another host", host=host.name, session=session, version=opened.version)
        return HostLost(f"host {host.name} was lost", host=host.name)

    async def _drain(self, name: str, undo: bool = False) -> dict:
        """Open no new session on host `name` and move its sessions off it; `undo`: let it
        take sessions again."""
        host = self.hosts.get(name)
        if host is None:
            raise UnknownHost(f"no host {name!r}; `llfabric status` lists them", host=name)
        host.draining = not undo
        if undo:
            self._freed()
            return {"host": name, "moved": []}
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
                decision = await self._place(b"", key, "", lease=False)
                if decision.host is None or decision.host == name:
                    continue  # nowhere else to go: it stays until a host takes it
                await self._move(key, decision)
            moved.append({"session": key[1], "to": decision.host})
        return {"host": name, "moved": moved}

    async def _status(self, identity: bytes, user: str) -> dict:
        """The cluster as `user` sees it: every host's status merged, and the hosts."""
        hosts = [h for h in self.hosts.values() if h.alive]
        status = Status()
        finals = await asyncio.gather(*(
            self._call(identity, user, h, status, status.to_wire(next(self._ids)))
            for h in hosts))
        parts = [(h, f) for h, f in zip(hosts, finals, strict=True) if f.get("type") == "reply"]
        merged = {"pid": os.getpid(), "uptime": time.time() - self.started,
                  "address": self.config.address, "store": self.config.remote, "user": user,
                  "zygotes": [], "workers": [], "templates": [], "sessions": [],
                  "worker_source": parts[0][1]["worker_source"] if parts else "zygote",
                  "leases": {"kind": parts[0][1]["leases"]["kind"] if parts else "cpu",
                             "slots": 0, "threads": 0, "held": 0,
                             "queued": len(self.waiting), "leases": [], "queue": []}}
        for host, part in parts:
            for name in ("zygotes", "workers", "templates"):
                merged[name] += part[name]
            merged["sessions"] += [{**s, "host": host.name,
                                    "lease_seconds": s["lease_seconds"] + self._leased_elsewhere(
                                        (user, s["session"]), host.name)}
                                   for s in part["sessions"]]
            leases = merged["leases"]
            for name in ("slots", "held", "queued"):
                leases[name] += part["leases"][name]
            leases["threads"] = max(leases["threads"], part["leases"]["threads"])
            leases["leases"] += [{**s, "host": host.name} for s in part["leases"]["leases"]]
            leases["queue"] += [{**q, "host": host.name} for q in part["leases"]["queue"]]
        sourced = {h.name: part.get("sourced", {}) for h, part in parts}
        merged["hosts"] = [{**h, "sourced": sourced.get(h["name"], {})}
                           for h in self._host_table()]
        return merged

    def _leased_elsewhere(self, key: Key, here: str) -> float:
        opened = self.sessions.get(key)
        return sum(v for h, v in opened.leased.items() if h != here) if opened else 0.0

    def _host_table(self) -> list[dict]:
        """The hosts, as `status` lists them (and the metrics read them)."""
        return [{"name": h.name, "node": h.node, "address": h.address, "slots": h.slots,
                 "running": h.running, "alive": h.alive, "draining": h.draining,
                 "metrics": h.metrics,
                 "sessions": sum(1 for s in list(self.sessions.values())
                                 if s.host == h.name)}
                for h in list(self.hosts.values())]


def _holding(entries: object) -> dict[Key, int]:
    """A host's [user, session, memory] entries, checked: those not so shaped are skipped."""
    return {(e[0], e[1]): e[2] for e in entries if isinstance(e, list) and len(e) == 3
            and isinstance(e[0], str) and isinstance(e[1], str) and isinstance(e[2], int)} \
        if isinstance(entries, list) else {}


def run(config: Config) -> None:
    """Serve the Ray cluster at `config.ray` until SIGTERM or SIGINT."""
    members = RayMembers(config.ray, str(config.store), {
        "LLFABRIC_REMOTE": config.remote, "LLFABRIC_COPIES": str(config.copies)})
    asyncio.run(Door(config, members).serve())

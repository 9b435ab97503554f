"""`llfabric serve --ray`: one front door for the hosts of a Ray cluster.

Clients speak the protocol they speak to one host (`fabric.messages`), with the same address
rules and keys (`fabric.front`); the door places each session on a host (`placement`) and carries
its requests there. Each client reaches each host over a connection of its own (`link.Link`),
admitted on the host as that client's user with a key the door made for them: the host keeps
its users' sessions apart, and sees a client that goes away as gone, exactly as if it had
connected itself.
The door reads each client's frame once, and calls the host through that client's link with the
typed request (`remote.RemoteHost`, the host face of `fabric.host`); events go straight on to
the client, each request's final frame comes back as its typed reply. Where a session goes is
`moves.Moves`'s (by the one policy, `placement`); which hosts there are, `membership.Membership`'s.

Sessions move between hosts through the store: a host reads the state it lacks from the peer
that has it, else from the remote tier, where every commit is before its cell is reported done
(without a remote, on `copies` hosts); a host that opens a session takes the newest head (the
remote's, else its peers'). A session is open on one host at a time, so its head has one writer.
A worker that alone holds values that could not be saved moves with its session (`Emigrate`).
When a host is lost (its node gone, its server silent), the requests it was serving fail with
`host_lost`, naming the version the session stays at, and the session's next request opens it
on another host; values only that host's worker held are rebuilt there from their lineage, or
reported lost. A lost host that comes back (resumed, or reached again) gives up every session it
had before the door takes it back (`membership`); a version it committed after the door last
heard from it is kept if no other host moved the session's head first (its next cell's client
is told, a `kept` notice), else refused by the head's compare-and-set.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import signal
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from .. import auth, stacks
from ..auth import ClientKey
from ..config import Config
from ..errors import (
    ConfigError,
    FabricError,
    Forbidden,
    HostLost,
    ProtocolError,
    SessionBusy,
    UnknownSession,
)
from ..front import Front, failure, msg_id_of
from ..host.face import Caller, call
from ..messages import (
    Close,
    Drain,
    Execute,
    Executed,
    GiveUp,
    Notice,
    Open,
    Ping,
    Pong,
    Remove,
    Removed,
    Reply,
    Request,
    Status,
)
from ..metrics import serve as serve_metrics
from ..private import private_dir
from ..snapshot.store import load_key
from ..status import HostStatus, LeaseStatus, ServerStatus, SessionStatus
from ..tasks import within
from .link import Link
from .members import Members, RayMembers
from .membership import HEALTH_EVERY, MISSES, Member, Membership
from .metrics import DoorMetrics
from .moves import Moves
from .opened import Key, Opened
from .placement import OVERSUBSCRIBE, POLICIES
from .remote import RemoteHost

log = logging.getLogger(__name__)

STORE_OPS = frozenset({"tag", "history", "versions", "holds"})  # served by any host's store


class Door:
    def __init__(self, config: Config, members: Members | None = None) -> None:
        if not config.remote and (config.copies < 2 or config.users == "separate"):
            raise ConfigError(
                "a cluster without a remote tier (`remote`, an fsspec URL every host reaches) "
                "keeps each commit on `copies` hosts, at least 2; and serving separate users, it "
                "needs the remote: their parts of the store are not shared between hosts",
                key="remote")
        if config.remote_writes != "commit":
            raise ConfigError("a cluster's hosts share the remote tier, whose heads are their "
                              "authority: each commit is there before its cell is reported "
                              "done (remote_writes = \"commit\")", key="remote_writes")
        self.config = config
        # its claim, the hosts' folders on this node, and the key every host's store signs with
        self.key = load_key(private_dir(config.store) / "key")
        public, secret = (k.decode() for k in zmq.curve_keypair())
        self.peer_pair = (public, secret)  # the key pair hosts read each other's blobs with
        self.metrics = DoorMetrics(lambda: self.membership.table())
        self.front = Front(config, lambda: self.metrics.auth_failures.inc())
        self.members = members
        self.owner = auth.owner_name()
        self.sessions: dict[Key, Opened] = {}
        self.links: dict[tuple[bytes, str], Link] = {}
        self.keys: dict[str, tuple[str, str]] = {}  # user -> the key pair hosts admit them by
        if config.placement not in POLICIES:
            raise ConfigError(f"placement is locality or random, not {config.placement!r}",
                              key="placement")
        self.membership = Membership(
            members, self.sessions, self.links, self.host, self.owner, self.keys, self.key,
            self.peer_pair, self.metrics, config.idle_release, self.spawn,
            waiting=lambda: len(self.moves.waiting), freed=lambda: self.moves.freed())
        self.moves = Moves(
            self.membership, self.sessions, self.host, self.owner, self.front.send, self.metrics,
            config.oversubscribe or OVERSUBSCRIBE,
            random.Random() if config.placement == "random" else None)
        self.context = zmq.asyncio.Context()
        self.started = time.time()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    # serving
    async def serve(self, ready: asyncio.Event | None = None) -> None:
        async with self.front.bound():
            await self._key_of(self.owner)
            await self.membership.look()
            await asyncio.gather(*self.membership.starts.values())
            metrics = serve_metrics(self.metrics.registry, self.config.metrics_bind) \
                if self.config.metrics_bind else None
            log.info("front door on %s: %d hosts", self.config.address,
                     len(self.membership.hosts))
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

    async def _watch(self) -> None:
        """Every `HEALTH_EVERY` seconds: the hosts looked at and pinged, the links of clients
        gone closed, sessions moved off hosts short of memory, the autoscaler asked."""
        while True:
            await asyncio.sleep(HEALTH_EVERY)
            await self.membership.check()
            self.forget_gone()
            for host in self.membership.pressed():
                self.spawn(self.moves.relieve(host))
            if self.members is not None:
                await self.membership.scale()

    async def _receive(self) -> None:
        while True:
            self.spawn(self._handle(await self.front.receive()))

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _handle(self, frames: list[zmq.Frame]) -> None:
        identity, msg_id = frames[0].bytes, msg_id_of(frames)
        try:
            user, message, request = self.front.read(frames)
            msg_id = message["msg_id"]
            final = (await self._dispatch(identity, Caller(user, msg_id=msg_id),
                                          request)).to_wire(msg_id)
        except Exception as exc:  # the client hears of it; the door keeps serving
            final = failure(exc, msg_id)
        self.front.send(identity, final)

    async def _dispatch(self, identity: bytes, caller: Caller, request: Request) -> Reply:
        user = caller.user
        match request:
            case Ping():
                return Pong(True, os.getpid(), user)
            case Status():
                return await self._status(identity, user)
            case Drain(host=name, undo=undo):
                if user != self.owner:
                    raise Forbidden(f"only {self.owner}, who runs the cluster, drains hosts",
                                    user=user)
                return await self.moves.drain(name, undo)
            case Remove():
                return await self._everywhere(identity, user, request)
            case GiveUp():
                raise ProtocolError("give_up is what a cluster's front door asks of a host "
                                    "it takes back, not a client's", op=request.op)
        name = getattr(request, "session", None)  # every other request names one
        assert isinstance(name, str)
        key = (user, name)
        opened = self.sessions.get(key)
        if isinstance(request, Open):
            return await self._open(identity, key, caller, request)
        if opened is None:
            if request.op in STORE_OPS:
                return await call(self.host(identity, user, self.membership.any()), caller,
                                  request)
            raise UnknownSession(f"no open session {name!r}; open it first", session=name)
        if isinstance(request, Execute):
            return await self._execute(identity, key, opened, caller, request)
        if isinstance(request, Close):  # not while a cell's placement or a drain moves it
            async with opened.turn:
                host = self.host(identity, user, await self.moves.host_of(key))
                closed = await host.close(caller, request)
                del self.sessions[key]
            return closed
        return await call(self.host(identity, user, await self.moves.host_of(key)), caller,
                          request)

    # sessions
    async def _open(self, identity: bytes, key: Key, caller: Caller,
                    request: Open) -> SessionStatus:
        new = key not in self.sessions
        opened = self.sessions.setdefault(key, Opened(request))
        opened.request = Open(request.session, request.cwd or opened.request.cwd,
                              request.env if request.env is not None else opened.request.env)
        hosts = self.membership.hosts
        here = hosts.get(opened.host) if opened.host else None
        lost = opened.host is None and opened.placed is not None  # with its host
        decision = None
        if here is None or not here.alive:
            decision = await self.moves.place(identity, key, "", lease=False)
            if decision.host is None:
                if new:
                    del self.sessions[key]
                raise HostLost(f"no host can take session {key[1]} now: every host is "
                               "draining or full", session=key[1])
            here = hosts[decision.host]
        try:
            status = await self.host(identity, key[0], here).open(caller, request)
        except FabricError:
            if new:
                del self.sessions[key]
            raise
        self.moves.reopened(key, lost, status.version)
        if decision is not None:
            self.moves.bind(key, decision)
        return _placed(status, opened)

    async def _execute(self, identity: bytes, key: Key, opened: Opened, caller: Caller,
                       request: Execute) -> Executed:
        if opened.running:  # the host says so too; placing it first could move the session
            raise SessionBusy(f"session {key[1]} is already running a cell", session=key[1])
        async with opened.turn:
            decision = await self.moves.where(identity, key, request.source, caller.msg_id)
            assert decision.host is not None
            host = self.membership.hosts[decision.host]
            host.running += 1
            opened.running = True
            try:
                if decision.host != opened.host:
                    await self.moves.move(key, decision)
                else:
                    self.moves.bind(key, decision)
            except BaseException:
                host.running -= 1
                opened.running = False
                self.moves.freed()
                raise
            if opened.kept is not None:  # told before the cell's outputs
                self.front.send(identity, Notice("kept", opened.kept, time.time())
                                .to_wire(caller.msg_id))
                opened.kept = None
        try:
            reply = await self.host(identity, key[0], host).execute(caller, request)
        finally:
            host.running -= 1
            opened.running = False
            self.moves.freed()
        opened.version = reply.version
        return _placed(reply, opened)

    async def _everywhere(self, identity: bytes, user: str, request: Remove) -> Removed:
        """A request every host's store answers (`remove`): no host keeps a stale copy."""
        done = await asyncio.gather(*(self.host(identity, user, h).remove(Caller(user), request)
                                      for h in self.membership.alive()),
                                    return_exceptions=True)
        self.sessions.pop((user, request.session), None)
        removed = next((r for r in done if isinstance(r, Removed)), None)
        if removed is not None:
            return removed
        if done:
            failed = done[0]
            assert isinstance(failed, BaseException)
            raise failed
        raise HostLost("no host is up")

    async def _status(self, identity: bytes, user: str) -> ServerStatus:
        """The cluster as `user` sees it: every host's status merged (of those that answer in
        time), and the hosts."""
        hosts = self.membership.alive()
        done = await asyncio.gather(*(  # a host silent until it is lost is left out meanwhile
            within(self.host(identity, user, h).status(Caller(user), Status()),
                   HEALTH_EVERY * MISSES) for h in hosts), return_exceptions=True)
        parts = [(h, p) for h, p in zip(hosts, done, strict=True) if isinstance(p, ServerStatus)]
        first = parts[0][1] if parts else None
        zygotes, workers, templates, sessions, slots, queue = [], [], [], [], [], []
        counts = {"slots": 0, "held": 0, "queued": len(self.moves.waiting), "threads": 0}
        for host, part in parts:
            zygotes += part.zygotes
            workers += part.workers
            templates += part.templates
            sessions += [dataclasses.replace(s, host=host.name, lease_seconds=s.lease_seconds
                                             + self._leased_elsewhere((user, s.session),
                                                                      host.name))
                         for s in part.sessions]
            leases = part.leases
            for name in ("slots", "held", "queued"):
                counts[name] += getattr(leases, name)
            counts["threads"] = max(counts["threads"], leases.threads)
            slots += [dataclasses.replace(s, host=host.name) for s in leases.leases]
            queue += [dataclasses.replace(q, host=host.name) for q in leases.queue]
        sourced = {h.name: part.sourced for h, part in parts}
        return ServerStatus(
            os.getpid(), time.time() - self.started, self.config.address, self.config.remote,
            user, LeaseStatus(first.leases.kind if first else "cpu", leases=tuple(slots),
                              queue=tuple(queue), **counts),
            tuple(zygotes), tuple(workers), first.worker_source if first else "zygote",
            tuple(templates), tuple(sessions),
            hosts=tuple(HostStatus(**h, sourced=sourced.get(h["name"], {}))
                        for h in self.membership.table()))

    def _leased_elsewhere(self, key: Key, here: str) -> float:
        opened = self.sessions.get(key)
        return sum(v for h, v in opened.leased.items() if h != here) if opened else 0.0

    # carrying requests
    def host(self, identity: bytes, user: str, member: Member) -> RemoteHost:
        """`member`, called over the link of the client `identity` (b"": the door's own) as
        `user`."""
        async def link(request: Request) -> Link:
            if not member.alive:
                raise self.membership.lost_error(member, request, user)
            link = self.links.get((identity, member.name))
            if link is None:
                public, secret = await self._key_of(user)
                relay = (lambda frame: self.front.send(identity, frame)) if identity else \
                    (lambda frame: None)
                link = self.links[(identity, member.name)] = Link(
                    self.context, member.name, member.address,
                    ClientKey(user, public, secret, member.server_key), relay)
            return link

        return RemoteHost(link)

    async def _key_of(self, user: str) -> tuple[str, str]:
        """The key pair the door connects to hosts with as `user` (hosts learn it at once)."""
        if user not in self.keys:
            public, secret = (k.decode() for k in zmq.curve_keypair())
            self.keys[user] = (public, secret)
            if self.members is not None:
                await asyncio.gather(*(
                    asyncio.to_thread(self.members.admit, h.node, user, public)
                    for h in self.membership.alive()), return_exceptions=True)
        return self.keys[user]

    def forget_gone(self) -> None:
        """Close the links of clients no longer connected: their hosts see them gone (a running
        cell then runs on for the host's `detached_grace`, for a client that follows it)."""
        for identity in {i for i, _ in self.links if i}:
            if not self.front.connected(identity):
                for (i, name), link in list(self.links.items()):
                    if i == identity:
                        link.close()
                        del self.links[(i, name)]


Placed = TypeVar("Placed", SessionStatus, Executed)


def _placed(reply: Placed, opened: Opened) -> Placed:
    """A host's reply, with where the door placed the session, and why."""
    if opened.placement is None:
        return reply
    return dataclasses.replace(reply, host=opened.placed, placement=opened.placement)


def run(config: Config) -> None:
    """Serve the Ray cluster at `config.ray` until SIGTERM or SIGINT."""
    members = RayMembers(config.ray, str(config.store), {
        "LLFABRIC_REMOTE": config.remote, "LLFABRIC_REMOTE_TIMEOUT": str(config.remote_timeout),
        "LLFABRIC_COPIES": str(config.copies)})
    door = Door(config, members)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, door.stop)
        stacks.on_sigusr1(loop)
        await door.serve()

    asyncio.run(serve())

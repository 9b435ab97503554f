"""The in-process host: a host's sessions, what they run on, and the requests that reach them.

It holds the host's store, zygotes and workers (`pool`), execution slots (`Leases`) and
environments; the sessions open on it, each its user's alone within their limits (`tenancy`);
the cells running on it and who follows them (`runs`); retention and gc (`upkeep`); and serves
the moves a cluster's front door asks for (`moves`). Every method answers one request with its
typed reply (`face.Host`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from .. import users
from ..config import GPU_LINGER, Config
from ..envs import Env, Envs
from ..errors import (
    ConfigError,
    EnvError,
    FabricError,
    Forbidden,
    ProtocolError,
    SessionBusy,
    UnknownEnv,
    UnknownSession,
)
from ..following import Send
from ..messages import (
    COMM_TYPES,
    EVENTS,
    Answer,
    CellHistory,
    CheckedOut,
    Checkout,
    Close,
    Closed,
    ClosureSummary,
    CommMessage,
    Complete,
    Completion,
    Debug,
    Debugged,
    Delivered,
    Draft,
    Drain,
    Drained,
    Emigrate,
    Emigrated,
    Execute,
    Executed,
    GivenUp,
    GiveUp,
    Held,
    History,
    Holds,
    Immigrate,
    Immigrated,
    InputAnswered,
    Inspect,
    Inspection,
    Interrupt,
    Interrupted,
    Open,
    Output,
    Ping,
    Pong,
    Remove,
    Removed,
    Status,
    Stop,
    Stopped,
    Tag,
    Tagged,
    VersionHistory,
    Versions,
)
from ..metrics import Metrics
from ..pool import Leases, Pool, cuda
from ..pool.cells import Emit
from ..pool.environ import worker_environ
from ..pool.lifecycle import Keeper
from ..pool.memory import Pressure
from ..private import private_dir
from ..protocol import Wire
from ..session import Session
from ..snapshot import Manifest, Store, history
from ..snapshot.behind import Backlog
from ..snapshot.peers import PeerList
from ..status import ServerStatus, SessionStatus
from . import moves
from .face import Caller
from .runs import Runs
from .tenancy import Tenancy
from .upkeep import Upkeep

log = logging.getLogger(__name__)


class LocalHost:
    def __init__(self, config: Config, send: Send, peers: PeerList | None = None) -> None:
        """`send`: a frame to a client's connection (the frames of a running cell); `peers`:
        a cluster's other hosts, whose blobs its store reads."""
        self.config = config
        separate = users.check_mode(config.users)  # each user's cells as their OS user
        # a host serving several users opens the store's root to passing through (`users.part`)
        if separate and config.remote and config.remote_writes == "behind":
            raise ConfigError("remote_writes = \"behind\" is not served with users = "
                              "\"separate\": each user's part of the store commits to the "
                              "remote (\"commit\")", key="remote_writes")
        self.store = Store(private_dir(config.store, shared=separate), remote=config.remote_tier,
                           peers=peers, copies=config.copies, tiers=config.tiers.split(","))
        self.backlog = Backlog.of(self.store)  # what a remote filled behind lacks
        self.tenancy = Tenancy(config, self.store, separate)
        self.envs = Envs(config.env_root)
        self.leases = Leases.for_host(config.slots, config.threads)
        # below 0, the default: GPUs linger (a parked worker's state costs a resume), CPU slots
        # park at once (their workers park for free)
        self.leases.linger = config.linger if config.linger >= 0 else \
            GPU_LINGER if self.leases.kind == "gpu" else 0
        if not 1 <= config.gpus <= self.leases.slots:  # every cell would be refused
            raise ConfigError(f"gpus is {config.gpus}; a session's cells may lease 1 to "
                              f"{self.leases.slots} slots on this host", key="gpus")
        cool_after = config.cool_after
        if separate and cool_after and not users.dumps_others():
            log.warning("no CAP_SYS_RESOURCE: CRIU cannot dump a user's worker, so a pinned "
                        "worker stays warm rather than cool (cool_after is not used)")
            cool_after = 0
        self.pool = Pool(config.store, max_zygotes=config.max_zygotes,
                         worker_source=config.worker_source, keep_warm=config.keep_warm,
                         cool_after=cool_after, zygote_memory=config.zygote_memory,
                         pressure=Pressure.here(config.memory_pressure, config.memory_relief,
                                                config.memory_stall),
                         gpu=self.leases.kind == "gpu", worker_memory=config.worker_memory,
                         user_pids=config.user_pids,
                         environ=worker_environ(config.worker_env, separate, os.environ),
                         save_limit=config.save_limit, track_writes=bool(config.track_writes))
        self.keeper = Keeper(self.pool, config.kept_memory, config.user_memory)
        if self.leases.kind == "gpu":
            self.pool.cuda = cuda.find_driver()
            if self.pool.cuda is None:
                log.warning("no CUDA checkpoint driver: kept workers stay on their GPU")
        self.sessions: dict[str, Session] = {}  # by their names in the store
        self.runs = Runs(config, send)
        self.upkeep = Upkeep(config, self.store, self.tenancy.stores,
                             lambda: list(self.sessions.values()))
        self.metrics = Metrics(self._scrape)
        self.started = time.time()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.pool.start()
        if self.backlog is not None:
            self.backlog.start()

    async def shut(self) -> None:
        if self.backlog is not None:
            self.backlog.stop()
        await self.keeper.stop()
        await self.pool.stop()

    def session(self, user: str, name: str) -> Session:
        """The user's session `name`, open here."""
        session = self.sessions.get(self.tenancy.stored(user, name))
        if session is None:
            raise UnknownSession(f"no open session {name!r}; open it first", session=name)
        return session

    # sessions
    async def open(self, caller: Caller, request: Open) -> SessionStatus:
        user, name, env = caller.user, request.session, request.env
        stored = self.tenancy.stored(user, name)
        session = self.sessions.get(stored)
        if env and self.tenancy.separate:  # before anything opens
            raise EnvError("environments are not served with users = \"separate\": the "
                           "server's zygotes would import their packages, which their user "
                           "writes, as the server's user; install into the server's packages",
                           session=name)
        chosen = self.envs.get(user, env) if env else None  # UnknownEnv before anything opens
        if session is None:
            mine = self.tenancy.mine(user, self.sessions)
            self.tenancy.check_limit(user, "user_sessions", len(mine), "open sessions")
            account = self.tenancy.account(user)  # Forbidden: no OS account, or root's
            cwd = request.cwd or (account.home if account is not None else os.getcwd())
            # a user's worker enters it as them: the server would tell whether others' exist
            if account is None and not os.path.isdir(cwd):
                raise FabricError(f"working directory {cwd!r} does not exist", session=name)
            store = self.tenancy.store_of(user)
            # it may have moved on another host; a slow remote holds no other request up
            await asyncio.to_thread(_adopt, store, stored)
            session = Session(stored, cwd, store, self.pool, self.leases, self.keeper,
                              interrupt_grace=self.config.interrupt_grace, gpus=self.config.gpus,
                              env=chosen if env is not None else
                              _head_env(self.tenancy, self.envs, user, stored),
                              account=account)
            session.admit = lambda manifest: self.tenancy.admit(user, stored, manifest)
            self.sessions[stored] = session
        elif env is not None:
            session.use_env(chosen)
        return self._public(user, session)

    def _public(self, user: str, session: Session) -> SessionStatus:
        """A session's status as its user sees it: their name for it, and how long its running
        cell has gone unfollowed, if it has."""
        status = session.status()
        return SessionStatus.from_wire(
            {**status, "session": self.tenancy.public_name(user, session.name),
             "detached": self.runs.detached(session.name)})

    async def close(self, caller: Caller, request: Close) -> Closed:
        session = self.session(caller.user, request.session)
        await session.close()
        del self.sessions[session.name]
        self.runs.forget(session.name)
        return Closed(True, session.manifest.version, self.leases.seconds_of(session.name))

    async def remove(self, caller: Caller, request: Remove) -> Removed:
        """Close the session if it is open (refused while it runs a cell) and remove it from
        the store; gc frees its data."""
        name = request.session
        stored = self.tenancy.stored(caller.user, name)
        session = self.sessions.get(stored)
        if session is not None:
            if session.lock.locked():
                raise SessionBusy(f"session {name} is running a cell: interrupt it or wait "
                                  "before removing it", session=name)
            await session.close()
            del self.sessions[stored]
            self.runs.forget(stored)
        if not await asyncio.to_thread(history.remove, self.tenancy.store_of(caller.user),
                                       stored):  # the remote's copy too: off the loop
            raise UnknownSession(f"no session {name!r} in the store", session=name)
        return Removed(True)

    # the store's, open or not
    async def tag(self, caller: Caller, request: Tag) -> Tagged:
        stored, store = self._stored(caller.user, request.session)
        manifest = await asyncio.to_thread(history.tag, store, stored, request.version,
                                           request.name)  # named on the remote too
        return Tagged(manifest.version, request.name)

    async def history(self, caller: Caller, request: History) -> CellHistory:
        stored = self.tenancy.stored(caller.user, request.session)
        session = self.sessions.get(stored)  # open here: with its cells that made no version
        store = self.tenancy.store_of(caller.user)
        if session is not None and store.head(stored) is None:  # no cell committed yet
            return CellHistory(())
        self._stored(caller.user, request.session)  # UnknownSession if the store lacks it
        cells = session.history() if session is not None else history.cells(store, stored)
        return CellHistory(tuple(cells))

    async def versions(self, caller: Caller, request: Versions) -> VersionHistory:
        stored = self.tenancy.stored(caller.user, request.session)
        store = self.tenancy.store_of(caller.user)
        versions = history.log(store, stored)
        if not versions:
            raise UnknownSession(f"no session {request.session!r} in the store",
                                 session=request.session)
        described: list[Wire] = history.describe(versions, store.index(stored))
        return VersionHistory(tuple(described))

    def _stored(self, user: str, name: str) -> tuple[str, Store]:
        """The session's name in the store and the store, which must hold it."""
        stored, store = self.tenancy.stored(user, name), self.tenancy.store_of(user)
        if store.head(stored) is None:
            raise UnknownSession(f"no session {name!r} in the store", session=name)
        return stored, store

    # an open session's
    async def draft(self, caller: Caller, request: Draft) -> ClosureSummary:
        return self.session(caller.user, request.session).draft(request.source)

    async def execute(self, caller: Caller, request: Execute) -> Executed:
        user = caller.user
        session = self.session(user, request.session)
        self.tenancy.check_cell(user)
        if self.config.user_memory:  # the user's kept workers leave first, ranked
            held = await self.keeper.fit(session.agent.user, session.prepared)
            self.tenancy.check_limit(user, "user_memory", held, "bytes of memory in their "
                                     "workers")
        running = self.tenancy.running
        running[user] = running.get(user, 0) + 1
        try:
            reply = await session.execute(request.source, _emitter(caller), stdin=request.stdin,
                                          gpus=request.gpus, count=request.execution_count,
                                          parent_id=request.parent_id)
            self.metrics.cell(reply)
            return reply
        finally:
            running[user] -= 1
            self.upkeep.after_cell()

    async def complete(self, caller: Caller, request: Complete) -> Completion:
        return await self.session(caller.user, request.session).complete(request.source,
                                                                         request.cursor)

    async def inspect(self, caller: Caller, request: Inspect) -> Inspection:
        return await self.session(caller.user, request.session).inspect(
            request.source, request.cursor, request.detail)

    async def comm(self, caller: Caller, request: CommMessage) -> Delivered:
        session = self.session(caller.user, request.session)
        if request.msg_type not in COMM_TYPES - {"comm_open"}:
            raise ProtocolError(f"a frontend's comm message is comm_msg or comm_close, "
                                f"not {request.msg_type!r}", op=request.op)
        return await session.comm(request.msg_type, request.content, request.buffers or [],
                                  _emitter(caller), request.parent_id)

    async def debug(self, caller: Caller, request: Debug) -> Debugged:
        session = self.session(caller.user, request.session)
        if self.tenancy.separate:  # a worker's debugger listens on a port any local user reaches
            raise Forbidden("the debugger is not served with users = \"separate\"",
                            session=request.session)
        return Debugged(await session.debug(request.content))

    async def interrupt(self, caller: Caller, request: Interrupt) -> Interrupted:
        return Interrupted(self.session(caller.user, request.session).interrupt())

    async def stop(self, caller: Caller, request: Stop) -> Stopped:
        """Stop the session's running cell, whichever client ran it (or none follows it), and
        answer once it is over: its slot is back and the session takes cells again."""
        session = self.session(caller.user, request.session)
        if not session.lock.locked():
            return Stopped(False)
        self.runs.stopping(session.name)
        session.stop("stop")
        async with session.lock:
            return Stopped(True, session.manifest.version)

    async def answer(self, caller: Caller, request: Answer) -> InputAnswered:
        return self.session(caller.user, request.session).answer(request.value, request.error)

    async def checkout(self, caller: Caller, request: Checkout) -> CheckedOut:
        session = self.session(caller.user, request.session)
        return await asyncio.to_thread(session.checkout, request.version)  # a remote move

    # the host's
    async def status(self, caller: Caller, request: Status) -> ServerStatus:
        """The host as `user` may see it: their sessions, and others' only as busy slots."""
        user = caller.user
        mine = self.tenancy.mine(user, self.sessions)
        leases = self.leases.status()
        for entry in (*leases["leases"], *leases["queue"]):
            if "session" in entry:
                entry["session"] = (self.tenancy.public_name(user, entry["session"])
                                    if entry["session"] in mine else "(another user's)")
        return ServerStatus.from_wire({
            "pid": os.getpid(), "uptime": time.time() - self.started,
            "address": self.config.address, "store": str(self.config.store), "user": user,
            "leases": leases, **self.pool.status(), "memory": self.keeper.status(),
            "sourced": dict(self.store.sourced),  # bytes fetched from peers and the remote
            "sessions": [self._public(user, self.sessions[s]).to_map() for s in mine],
        } | ({"upkeep": self.upkeep.last.to_map()} if self.upkeep.last is not None else {})
          | ({"backlog": self.backlog.status()} if self.backlog is not None else {}))

    async def ping(self, caller: Caller, request: Ping) -> Pong:
        """To the user who runs the host (a cluster's front door, which moves sessions): where
        it wakes workers carried to it, and, short of memory, the memory each session's worker
        holds (the door moves the largest elsewhere)."""
        if caller.user != self.tenancy.owner:
            return Pong(True, os.getpid(), caller.user)
        pressure = self.pool.memory_pressure()
        holding: list[tuple[str, str, int]] = []
        for stored, session in self.sessions.items() if pressure else ():
            user = self.tenancy.user_of(stored)
            if memory := session.status()["memory"]:
                holding.append((user, self.tenancy.public_name(user, stored), memory))
        return Pong(True, os.getpid(), caller.user, str(self.pool.socket_dir), pressure,
                    tuple(holding))

    # a cluster's
    async def holds(self, caller: Caller, request: Holds) -> Held:
        stored = self.tenancy.stored(caller.user, request.session)
        return moves.held(self.tenancy.store_of(caller.user), stored,
                          self.sessions.get(stored), request.source)

    async def drain(self, caller: Caller, request: Drain) -> Drained:
        raise ProtocolError("drain moves sessions between the hosts of a cluster; this "
                            "server is one host", op=request.op)

    async def emigrate(self, caller: Caller, request: Emigrate) -> Emigrated:
        """Close the session here for another host, its pinned worker dumped for that host
        first (see `Emigrate`)."""
        self.tenancy.check_owner(caller.user, request.op)
        session = self.session(request.user, request.session)
        image = await moves.hand_over(session, self.store, request.wake_dir)
        closed = await self.close(Caller(request.user), Close(request.session))
        return Emigrated(closed.closed, closed.version, closed.lease_seconds, image)

    async def immigrate(self, caller: Caller, request: Immigrate) -> Immigrated:
        self.tenancy.check_owner(caller.user, request.op)
        return await moves.take_in(self.session(request.user, request.session), self.pool,
                                   self.store, request.image)

    async def give_up(self, caller: Caller, request: GiveUp) -> GivenUp:
        """Close every session open here (see `GiveUp`). A running cell is stopped, and the
        client that follows it, if any, told why; one already past its save ends first: the
        head's compare-and-set keeps its commit, or refuses it if the session moved on."""
        self.tenancy.check_owner(caller.user, request.op)
        given: list[tuple[str, str]] = []
        for stored, session in list(self.sessions.items()):
            user = self.tenancy.user_of(stored)
            name = self.tenancy.public_name(user, stored)
            self.runs.stopping(stored)
            session.stop("moved")
            async with session.lock:  # its cell is over
                pass
            if self.sessions.get(stored) is session:
                await self.close(Caller(user), Close(name))
                given.append((user, name))
        if given:
            log.warning("the front door lost this host: its %d sessions open elsewhere now, "
                        "and are closed here", len(given))
        return GivenUp(tuple(given))

    def _scrape(self) -> Wire:
        """What the metrics read at a scrape (in the HTTP server's thread), taken in the loop
        that changes it."""
        async def now() -> Wire:
            return {"leases": self.leases.status(), "workers": len(self.pool.workers),
                    "zygotes": len(self.pool.zygotes),
                    "sessions": [s.status() for s in self.sessions.values()],
                    "memory": self.keeper.status(),
                    "sourced": dict(self.store.sourced),
                    "sourced_seconds": dict(self.store.sourced_seconds),
                    "replicated": self.store.replicated,
                    "backlog": self.backlog.status() if self.backlog is not None else None}

        if self._loop is None:
            raise RuntimeError("the host is not serving")
        return asyncio.run_coroutine_threadsafe(now(), self._loop).result(timeout=10)


def _adopt(store: Store, stored: str) -> None:
    """Take the session's head where it may have moved (`Store.adopt_head`), and its manifest
    onto this disk, where the session reads it as it opens."""
    head = store.adopt_head(stored)
    if head is not None:
        store.get_manifest(head)


def _head_env(tenancy: Tenancy, envs: Envs, user: str, stored: str) -> Env | None:
    """The environment the session's head version ran in, if its user still has it."""
    store = tenancy.store_of(user)
    head = store.head(stored)
    if head is None or tenancy.separate:  # not served there (`open`)
        return None
    name = Manifest.decode(store.get_manifest(head)).env.get("name")
    try:
        return envs.get(user, name) if name else None
    except UnknownEnv:
        log.warning("session %s ran in environment %s, which is gone: it runs on the "
                    "server's packages", stored, name)
        return None


def _emitter(caller: Caller) -> Emit:
    """A session's emit(payload, event): the caller's events."""
    def emit(payload: Wire, event: str = "output") -> None:
        caller.emit(Output(payload) if event == "output" else EVENTS[event](**payload))
    return emit

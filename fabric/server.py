"""`llfabric serve`: the ROUTER socket clients talk to, and the sessions behind it.

One asyncio loop serves every client: a request becomes a task, so a long cell of one session
never blocks another session's draft, an interrupt, or `status`. Whatever a request does wrong
ends as an error reply to it; the loop keeps serving.

Every connection is admitted as a user (`fabric.auth`: a CURVE key on tcp://, the OS user on
ipc://); a user reaches only their own sessions, within the configured per-user limits.

Clients are watched while their cells run: libzmq pings each connection every `heartbeat`
seconds and drops one silent for `heartbeat_timeout`. A running cell whose client is no longer
connected (gone, killed, or silent) runs on for `detached_grace` seconds, its outputs kept, so
that another client (the kernel started after one that died) can `follow` it
(`fabric.following`); with nobody following it by then, it is stopped, so that its lease comes
back. `stop` stops a session's cell whichever client ran it; `close` only from a client that
follows the cell; a cell whose user's key was revoked is stopped within a heartbeat.

The store stays bounded: after cells commit, and every `gc_interval` seconds besides (versions
age out of the policy's hours and days without any commit), a thread thins each session's
history by the retention policy and collects what that released (`history.retain`,
`history.gc`), off the cell path: one pass at a time, and commits during a pass ask for one
more. What open sessions build on (their heads, what their drafts loaded) is never thinned.
Past `disk_pressure` percent of the store's disk, the operator is told (log and `status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import zmq

from . import auth, users
from .closure import closure, plan
from .cluster.peers import Peers, PeerServer
from .config import GPU_LINGER, Config
from .envs import Env, Envs
from .errors import (
    ConfigError,
    EnvError,
    FabricError,
    Forbidden,
    LimitReached,
    ProtocolError,
    SessionBusy,
    StoreError,
    UnknownEnv,
    UnknownSession,
)
from .following import Run
from .front import Front, failure, msg_id_of
from .messages import (
    COMM_TYPES,
    EVENTS,
    Answer,
    Checkout,
    Close,
    CommMessage,
    Complete,
    Debug,
    Draft,
    Drain,
    Emigrate,
    Execute,
    Follow,
    Followed,
    History,
    Holds,
    Immigrate,
    Inspect,
    Interrupt,
    Open,
    Output,
    Ping,
    Remove,
    Request,
    Status,
    Stop,
    Tag,
    Versions,
)
from .metrics import Metrics
from .pool import Leases, Pool, criu, cuda, migration
from .pool.environ import worker_environ
from .pool.lifecycle import Keeper, Life
from .private import private_dir
from .session import Session
from .snapshot import Manifest, Store, history
from .snapshot.commit import head_manifest
from .status import REPLIES

log = logging.getLogger(__name__)

UPKEEP_SHARE = 5  # retention and gc take at most a fifth of the server's time


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        # refuses a bad address before anything starts
        self.front = Front(config, lambda: self.metrics.auth_failures.inc())
        self.separate = users.check_mode(config.users)  # each user's cells as their OS user
        # a host serving several users opens the store's root to passing through (`users.part`)
        self.store = Store(private_dir(config.store, shared=self.separate), remote=config.remote,
                           peers=Peers(Path(config.peers)) if config.peers else None,
                           copies=config.copies)
        self._parts: dict[str, Store] = {}  # each user's part of the store, when separate
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
        if self.separate and cool_after and not users.dumps_others():
            log.warning("no CAP_SYS_RESOURCE: CRIU cannot dump a user's worker, so a pinned "
                        "worker stays warm rather than cool (cool_after is not used)")
            cool_after = 0
        self.pool = Pool(config.store, max_zygotes=config.max_zygotes,
                         worker_source=config.worker_source, keep_warm=config.keep_warm,
                         cool_after=cool_after, zygote_memory=config.zygote_memory,
                         pressure_percent=config.memory_pressure,
                         gpu=self.leases.kind == "gpu", worker_memory=config.worker_memory,
                         user_pids=config.user_pids,
                         environ=worker_environ(config.worker_env, self.separate, os.environ),
                         save_limit=config.save_limit)
        self.keeper = Keeper(self.pool)
        if self.leases.kind == "gpu":
            self.pool.cuda = cuda.find_driver()
            if self.pool.cuda is None:
                log.warning("no CUDA checkpoint driver: kept workers stay on their GPU")
        self.owner = auth.owner_name()
        self.sessions: dict[str, Session] = {}  # by their names in the store (_store_name)
        self.running: dict[str, int] = {}  # cells each user runs now
        self.started = time.time()
        self._tasks: set[asyncio.Task] = set()
        # the executes in progress, by their sessions' names (one cell at a time each), and
        # those that ended while no client followed them, their final frames not yet taken
        self._runs: dict[str, Run] = {}
        self._unclaimed: dict[str, Run] = {}
        self._stop = asyncio.Event()
        self.policy = config.policy
        self._wanted = asyncio.Event()  # a cell committed: retention and gc now
        self._pressure: float | None = None  # the disk's percent in use, while past its limit
        self.upkeep: dict = {}  # the latest retention and gc pass, for `status`
        self.metrics = Metrics(self._scrape)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        async with self.front.bound():
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
            self._loop = loop
            metrics = self.metrics.serve(self.config.metrics_bind) if self.config.metrics_bind \
                else None
            # a cluster's host: its blobs, for its peers
            peers = PeerServer(self.store, self.config.peer_bind,
                               auth.Keys(self.config.key_dir / "peers")) \
                if self.config.peer_bind else None
            try:
                await self.pool.start()
                log.info("serving on %s, store %s, %d %s slots", self.config.address,
                         self.config.store, self.leases.slots, self.leases.kind)
                if ready is not None:
                    ready.set()
                if peers is not None:
                    peers.start()
                loops = [self._receive(), self._watch_clients(), self._upkeep()]
                running = [asyncio.ensure_future(loop) for loop in loops]
                for task in running:
                    task.add_done_callback(_ended)
                await self._stop.wait()
                for task in running:
                    task.cancel()
            finally:
                for task in list(self._tasks):
                    task.cancel()
                if metrics is not None:
                    metrics.shutdown()
                    metrics.server_close()
                if peers is not None:
                    peers.stop()
                await self.keeper.stop()
                await self.pool.stop()

    def stop(self) -> None:
        self._stop.set()

    async def _receive(self) -> None:
        while True:
            frames = await self.front.receive()
            task = asyncio.ensure_future(self._handle(frames))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _watch_clients(self) -> None:
        """Notice the running cells whose clients are no longer connected: each runs on for
        `detached_grace` seconds unless a client follows it, then is stopped."""
        grace = self.config.detached_grace
        while True:
            await asyncio.sleep(self.config.heartbeat or 1)
            now = time.monotonic()
            for run in list(self._runs.values()):
                session = run.session
                if not run.stopping and not run.admitted():
                    log.warning("session %s: its user's key was revoked; stopping its cell",
                                session.name)
                    run.stopping = True
                    session.stop("revoked")
                elif run.prune(self.front.connected):
                    run.detached = now
                    if grace <= 0:
                        log.warning("session %s: its client went away; stopping its cell",
                                    session.name)
                        run.stopping = True
                        session.stop("client")
                    else:
                        log.warning("session %s: its client went away; its cell runs on for "
                                    "%d s unless a client follows it", session.name, grace)
                        run.no_stdin()
                elif (run.detached is not None and not run.targets and not run.stopping
                      and now - run.detached >= grace):
                    log.warning("session %s: no client followed its cell within %d s; "
                                "stopping it", session.name, grace)
                    run.stopping = True
                    session.stop("detached")

    async def _upkeep(self) -> None:
        """Retention and gc in a thread, when cells have committed and every `gc_interval`
        seconds; a pass that fails is logged and the next one tries again."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), self.config.gc_interval or None)
            self._wanted.clear()  # before the pass: a commit during it asks for another
            started = time.monotonic()
            try:
                summary = await asyncio.to_thread(self.collect, self._protected(),
                                                  self._saving_since())
                self.upkeep = {**summary, "pressure": self._pressure is not None}
            except Exception:
                log.exception("retention and gc failed; the next commit or %d s retries",
                              self.config.gc_interval)
            # a pass holds the interpreter much of its time: commits in quick succession wait
            await asyncio.sleep((UPKEEP_SHARE - 1) * (time.monotonic() - started))

    def _protected(self) -> set[str]:
        """The versions open sessions build on: heads, and what prepared workers loaded."""
        ids = {s.head for s in self.sessions.values()}
        ids |= {s.prepared.base for s in self.sessions.values() if s.prepared is not None}
        return {i for i in ids if i}

    def _saving_since(self) -> float:
        """When the oldest save that may still commit began: the pass's own start, or the
        start of a cell running now, if earlier (`history.gc`)."""
        return min([time.time(), *(s.running_since for s in self.sessions.values()
                                   if s.running_since is not None)])

    def collect(self, protect: set[str], saving_since: float | None = None) -> dict:
        """One pass: thin every session's history, then free what that released (in the
        store, and in each user's part of it); `saving_since`: see `history.gc`."""
        started, thinned, removed, freed, kept = time.time(), 0, 0, 0, 0
        for store in users.stores(self.store) if self.separate else [self.store]:
            for name in store.sessions():
                try:
                    thinned += len(history.retain(store, name, self.policy, protect))
                except StoreError as exc:  # a damaged session keeps everything; gc reports it
                    log.warning("retention skipped session %s: %s", name, exc.message)
            result = history.gc(store, saving_since=saving_since)
            removed, freed = removed + result.removed, freed + result.freed
            kept += result.kept_bytes
        summary = {"time": started, "seconds": time.time() - started, "thinned": thinned,
                   "removed": removed, "freed": freed, "kept_bytes": kept,
                   "disk_percent": self.disk_percent()}
        log.info("retention thinned %d versions; gc freed %d bytes in %d files", thinned,
                 freed, removed)
        return summary

    def disk_percent(self) -> float:
        usage = shutil.disk_usage(self.store.root)
        return 100.0 * (usage.total - usage.free) / usage.total

    def _after_cell(self) -> None:
        """Ask for a retention and gc pass; past `disk_pressure` percent, tell the operator
        (the log, and `status`) once, until the disk is below it again."""
        self._wanted.set()
        percent = self.disk_percent()
        if not self.config.disk_pressure or percent < self.config.disk_pressure:
            self._pressure = None
        elif self._pressure is None:
            self._pressure = percent
            log.warning("the store's disk is %.0f%% full (disk_pressure = %d): retention and "
                        "gc run after every cell until it is below", percent,
                        self.config.disk_pressure)

    def _admit(self, user: str, stored: str, manifest: Manifest) -> None:
        """Refuse a commit that would take the user past `user_bytes`, before it is written."""
        if not self.config.user_bytes:
            return
        used = self._stored_bytes(user, but=stored) + history.size(manifest)
        if used > self.config.user_bytes:
            raise LimitReached(
                f"the commit of session {self._public_name(user, stored)} is refused: user "
                f"{user} would store {used} bytes, past this server's limit (user_bytes = "
                f"{self.config.user_bytes}); the session stays at its last version. Free space "
                "with `llfabric store rm` or a smaller retention", user=user,
                limit=self.config.user_bytes, used=used)

    async def _handle(self, frames: list[zmq.Frame]) -> None:
        identity, msg_id = frames[0].bytes, msg_id_of(frames)
        try:
            user, message, request = self.front.read(frames)
            msg_id = message["msg_id"]  # a valid one, however far into the frame it was

            if isinstance(request, Close):
                self._check_close(user, request.session, identity)
            if isinstance(request, Follow):
                if self._follow(user, request.session, identity, msg_id):
                    return  # the cell's frames come as it runs
                self.front.send(identity, Followed(False).to_wire(msg_id))
                return

            def emit(payload: dict, event: str = "output") -> None:
                sent = Output(payload) if event == "output" else EVENTS[event](**payload)
                if run is None:
                    self.front.send(identity, sent.to_wire(msg_id))
                else:
                    run.emit(sent.to_wire(""))

            run = self._start_run(user, request, identity, msg_id)
            if run is not None:
                run.admitted = self.front.admission(frames[1], user)
            try:
                answer = REPLIES[request.op]
                final = answer.from_wire(await self._dispatch(user, request, emit)).to_wire(msg_id)
            except Exception as exc:  # the client hears of it; the server keeps serving
                if isinstance(exc, FabricError) and isinstance(request, Execute):
                    log.info("session %s: the cell did not commit: %s", request.session,
                             exc.message)  # its client shows it; the log says it too
                final = failure(exc, msg_id)
            if run is None:
                self.front.send(identity, final)
            else:
                self._end_run(run, final)
        except Exception as exc:
            self.front.send(identity, failure(exc, msg_id))

    def _start_run(self, user: str, request: Request, identity: bytes,
                   msg_id: str) -> Run | None:
        """The `Run` of an execute of an open session not running a cell (another one is
        refused as busy, its frames its own client's only)."""
        if not isinstance(request, Execute):
            return None
        session = self.sessions.get(self._store_name(user, request.session))
        if session is None or session.name in self._runs or session.lock.locked():
            return None
        run = self._runs[session.name] = Run(session, self.front.send,
                                             output_limit=self.config.output_limit)
        run.attach(identity, msg_id, follow=False)
        self._unclaimed.pop(session.name, None)  # a new cell: the one before is no one's
        return run

    def _end_run(self, run: Run, final: dict) -> None:
        name = run.session.name
        if self._runs.get(name) is run:
            del self._runs[name]
        final = {k: v for k, v in final.items() if k != "msg_id"}
        if not run.finish(final) and self.sessions.get(name) is run.session:
            log.warning("session %s: its cell ended while no client followed it; its outputs "
                        "are kept for the next client that follows it", name)
            self._unclaimed[name] = run

    def _follow(self, user: str, name: str, identity: bytes, msg_id: str) -> bool:
        """Send `identity` the session's running cell, or one that ended unfollowed; False if
        there is none."""
        stored = self._session(user, name).name
        run = self._runs.get(stored) or self._unclaimed.pop(stored, None)
        if run is None:
            return False
        run.attach(identity, msg_id)
        return True

    def _check_close(self, user: str, name: str, identity: bytes) -> None:
        """Only a client that follows the session's running cell may close it (which stops
        the cell): another sharing the session, refused a cell of its own, must not."""
        run = self._runs.get(self._store_name(user, name))
        if run is not None and identity not in run.targets:
            raise SessionBusy(f"session {name} is running another client's cell; it stays "
                              f"open (`llfabric stop {name}` stops that cell)", session=name)

    def _store_name(self, user: str, name: str) -> str:
        """Where a user's session lives in the store: the server's own user keeps plain names,
        another's are prefixed with theirs ('~' is in no valid session or user name)."""
        return name if user == self.owner else f"{user}~{name}"

    def _user_of(self, store_name: str) -> str:
        user, prefixed, _ = store_name.partition("~")
        return user if prefixed else self.owner

    def _sessions_of(self, user: str) -> dict[str, Session]:
        return {key: s for key, s in self.sessions.items() if self._user_of(key) == user}

    def _account(self, user: str) -> users.Account | None:
        """The OS account `user`'s cells run as (None: the server's own, in single mode)."""
        return users.account(user, self.config.store) if self.separate else None

    def _store_of(self, user: str) -> Store:
        """Where `user`'s sessions live: the store, or their own part of it."""
        if not self.separate:
            return self.store
        if user not in self._parts:
            account = self._account(user)
            remote = f"{self.config.remote.rstrip('/')}/users/{user}" if self.config.remote else ""
            self._parts[user] = Store(Path(account.store), key=self.store.key,
                                      owner=(account.uid, account.gid), remote=remote)
        return self._parts[user]

    def _session(self, user: str, name: str) -> Session:
        session = self.sessions.get(self._store_name(user, name))
        if session is None:
            raise UnknownSession(f"no open session {name!r}; open it first", session=name)
        return session

    async def _dispatch(self, user: str, request: Request, emit) -> dict:
        match request:
            case Ping():
                return {"pong": True, "pid": os.getpid(), "user": user,
                        **(self._for_door() if user == self.owner else {})}
            case Status():
                return self.status(user)
            case Open(session=name, cwd=cwd, env=env):
                return self._open(user, name, cwd, env)
            case Remove(session=name):
                return await self._remove(user, name)
            case Tag(session=name, name=tag, version=version):  # open or not: tags are the store's
                return self._tag(user, name, version, tag)
            case History(session=name):  # open or not: the cells are the store's
                return self._history(user, name)
            case Versions(session=name):
                return self._versions(user, name)
            case Holds(session=name, source=source):
                return self._holds(user, name, source)
            case Drain():
                raise ProtocolError("drain moves sessions between the hosts of a cluster; this "
                                    "server is one host", op=request.op)
            case Emigrate(session=name, user=of, wake_dir=wake_dir):
                self._from_door(user, request)
                return await self._emigrate(of, name, wake_dir)
            case Immigrate(session=name, user=of, image=image):
                self._from_door(user, request)
                return await self._immigrate(of, name, image)
        session = self._session(user, request.session)
        match request:
            case Draft(source=source):
                return session.draft(source)
            case Execute(source=source, stdin=stdin, gpus=gpus, execution_count=count,
                         parent_id=parent_id):
                self._check_limit(user, "user_cells", self.running.get(user, 0), "running cells")
                if self.config.user_bytes:
                    self._check_limit(user, "user_bytes", self._stored_bytes(user),
                                      "bytes stored")
                self.running[user] = self.running.get(user, 0) + 1
                try:
                    reply = await session.execute(source, emit, stdin=stdin, gpus=gpus,
                                                  count=count, parent_id=parent_id)
                    self.metrics.cell(reply)
                    return reply
                finally:
                    self.running[user] -= 1
                    self._after_cell()
            case Complete(source=source, cursor=cursor):
                return await session.complete(source, cursor)
            case Inspect(source=source, cursor=cursor, detail=detail):
                return await session.inspect(source, cursor, detail)
            case CommMessage(msg_type=kind, content=content, buffers=buffers,
                             parent_id=parent_id):
                if kind not in COMM_TYPES - {"comm_open"}:
                    raise ProtocolError(f"a frontend's comm message is comm_msg or comm_close, "
                                        f"not {kind!r}", op=request.op)
                return await session.comm(kind, content, buffers or [], emit, parent_id)
            case Debug(content=content):
                if self.separate:  # a worker's debugger listens on a port any local user reaches
                    raise Forbidden("the debugger is not served with users = \"separate\"",
                                    session=request.session)
                return {"content": await session.debug(content)}
            case Interrupt():
                return {"interrupted": session.interrupt()}
            case Stop():
                return await self._stop_cell(session)
            case Answer(value=value, error=error):
                return session.answer(value, error)
            case Checkout(version=version):
                return session.checkout(version)
            case Close():
                return await self._close(session)
        raise ProtocolError(f"op {request.op!r} has no handler")  # a request defined, not served

    async def _stop_cell(self, session: Session) -> dict:
        """Stop the session's running cell, whichever client ran it (or none follows it), and
        answer once it is over: its slot is back and the session takes cells again."""
        if not session.lock.locked():
            return {"stopped": False}
        run = self._runs.get(session.name)
        if run is not None:
            run.stopping = True
        session.stop("stop")
        async with session.lock:
            return {"stopped": True, "version": session.manifest.version}

    async def _close(self, session: Session) -> dict:
        await session.close()
        del self.sessions[session.name]
        self._unclaimed.pop(session.name, None)
        return {"closed": True, "version": session.manifest.version,
                "lease_seconds": self.leases.seconds_of(session.name)}

    def _for_door(self) -> dict:
        """What a cluster's door (the owner) learns from its pings: where this host wakes
        workers carried to it, and, short of memory, the memory each session's worker holds
        (the door moves the largest elsewhere)."""
        pressure = self.pool.memory_pressure()
        holding = []
        for stored, session in self.sessions.items() if pressure else ():
            user = self._user_of(stored)
            if memory := session.status()["memory"]:
                holding.append([user, self._public_name(user, stored), memory])
        return {"wake_dir": str(self.pool.socket_dir), "pressure": pressure,
                "holding": holding}

    def _from_door(self, user: str, request: Request) -> None:
        """Requests only a cluster's front door sends, as the user who runs the hosts: a
        carried image is restored as whoever it was dumped as."""
        if user != self.owner:
            raise Forbidden(f"only {self.owner}, who runs this host, sends {request.op!r}",
                            user=user)

    async def _emigrate(self, user: str, name: str, wake_dir: str) -> dict:
        """Close the session here for another host, its pinned worker dumped for that host
        first (see `Emigrate`); a worker that cannot be dumped leaves its values to be
        recomputed there, or reported lost."""
        session, carried = self._session(user, name), None
        try:
            handed = await session.hand_over(wake_dir)
        except SessionBusy:
            raise  # its running cell is not cut short: the door moves sessions between cells
        except FabricError as exc:  # a dump or restore that failed: it closes all the same
            log.warning("session %s moves without its pinned worker: %s", session.name,
                        exc.message)
            handed = None
        if handed is not None:
            image, life = handed
            try:
                carried = (await asyncio.to_thread(migration.pack, self.store, image,
                                                   life)).to_wire()
            except FabricError as exc:  # a full disk, say: its values go as a dump's would
                log.warning("session %s moves without its pinned worker: %s", session.name,
                            exc.message)
            finally:
                criu.remove(image.images)
        return {**await self._close(session), "image": carried}

    async def _immigrate(self, user: str, name: str, wire: dict) -> dict:
        """Take another host's pinned worker into the session (see `Immigrate`)."""
        carried = migration.Carried.from_wire(wire)
        session = self._session(user, name)
        if carried.base != session.head:
            return {"arrived": False, "why": "it was dumped at another version than the "
                    "session's head here"}
        images = Path(tempfile.mkdtemp(prefix="m", dir=self.pool.socket_dir / "cool"))
        image = await asyncio.to_thread(migration.unpack, self.store, carried, images)
        image.user = session.agent.user  # restored into a cage of its user's
        session.arrive(Life.arrived(self.pool, image, carried.base, set(carried.holds),
                                    carried.unsaved))
        return {"arrived": True, "bytes": image.size}

    def _open(self, user: str, name: str, cwd: str | None, env: str | None) -> dict:
        stored = self._store_name(user, name)
        session = self.sessions.get(stored)
        if env and self.separate:  # before anything opens
            raise EnvError("environments are not served with users = \"separate\": the "
                           "server's zygotes would import their packages, which their user "
                           "writes, as the server's user; install into the server's packages",
                           session=name)
        chosen = self.envs.get(user, env) if env else None  # UnknownEnv before anything opens
        if session is None:
            self._check_limit(user, "user_sessions", len(self._sessions_of(user)),
                              "open sessions")
            account = self._account(user)  # Forbidden: no OS account, or root's
            cwd = cwd or (account.home if account is not None else os.getcwd())
            # a user's worker enters it as them: the server would tell whether others' exist
            if account is None and not os.path.isdir(cwd):
                raise FabricError(f"working directory {cwd!r} does not exist", session=name)
            self._store_of(user).adopt_head(stored)  # it may have moved on another host
            session = Session(stored, cwd, self._store_of(user), self.pool, self.leases,
                              self.keeper, interrupt_grace=self.config.interrupt_grace,
                              gpus=self.config.gpus,
                              env=chosen if env is not None else self._head_env(user, stored),
                              account=account)
            session.admit = lambda manifest: self._admit(user, stored, manifest)
            self.sessions[stored] = session
        elif env is not None:
            session.use_env(chosen)
        return self._public(user, session.status())

    def _head_env(self, user: str, stored: str) -> Env | None:
        """The environment the session's head version ran in, if its user still has it."""
        store = self._store_of(user)
        head = store.head(stored)
        if head is None or self.separate:  # not served there (`_open`)
            return None
        name = Manifest.decode(store.get_manifest(head)).env.get("name")
        try:
            return self.envs.get(user, name) if name else None
        except UnknownEnv:
            log.warning("session %s ran in environment %s, which is gone: it runs on the "
                        "server's packages", stored, name)
            return None

    def _holds(self, user: str, name: str, source: str) -> dict:
        """The bytes of the session's state (of `source`'s closure, if given) this host holds
        on its disk, and in a worker it keeps for the session."""
        store, stored = self._store_of(user), self._store_name(user, name)
        session = self.sessions.get(stored)
        head = store.head(stored)
        manifest = (session.manifest if session is not None and session.head == head
                    else head_manifest(store, stored, head))
        groups = closure(plan(source), manifest).groups if source else manifest.groups
        return {"bytes": sum(g.size for g in groups if store.has(g.blob)),
                "memory": session.status()["memory"] if session is not None else 0}

    def _tag(self, user: str, name: str, version: int | str | None, tag: str) -> dict:
        stored, store = self._store_name(user, name), self._store_of(user)
        if store.head(stored) is None:
            raise UnknownSession(f"no session {name!r} in the store", session=name)
        manifest = history.tag(store, stored, version, tag)
        return {"version": manifest.version, "name": tag}

    def _history(self, user: str, name: str) -> dict:
        stored, store = self._store_name(user, name), self._store_of(user)
        if store.head(stored) is None:
            if stored in self.sessions:  # opened, no cell committed yet
                return {"cells": []}
            raise UnknownSession(f"no session {name!r} in the store", session=name)
        session = self.sessions.get(stored)  # open here: with its cells that made no version
        cells = session.history() if session is not None else history.cells(store, stored)
        return {"cells": [list(cell) for cell in cells]}

    def _versions(self, user: str, name: str) -> dict:
        stored, store = self._store_name(user, name), self._store_of(user)
        versions = history.log(store, stored)
        if not versions:
            raise UnknownSession(f"no session {name!r} in the store", session=name)
        return {"versions": history.describe(versions, store.index(stored))}

    async def _remove(self, user: str, name: str) -> dict:
        """Close the session if it is open (refused while it runs a cell) and remove it from
        the store; gc frees its data."""
        stored = self._store_name(user, name)
        session = self.sessions.get(stored)
        if session is not None:
            if session.lock.locked():
                raise SessionBusy(f"session {name} is running a cell: interrupt it or wait "
                                  "before removing it", session=name)
            await session.close()
            del self.sessions[stored]
            self._unclaimed.pop(stored, None)
        if not history.remove(self._store_of(user), stored):
            raise UnknownSession(f"no session {name!r} in the store", session=name)
        return {"removed": True}

    def _check_limit(self, user: str, key: str, used: int, what: str) -> None:
        limit = getattr(self.config, key)
        if limit and used >= limit:
            raise LimitReached(f"user {user} has {used} {what}, the most this server allows "
                               f"({key} = {limit})", user=user, limit=limit)

    def _stored_bytes(self, user: str, but: str | None = None) -> int:
        """The bytes of the state at the head of each of `user`'s sessions in the store
        (`but` one)."""
        total, store = 0, self._store_of(user)
        for name in store.sessions():
            if self._user_of(name) == user and name != but:
                try:
                    manifest = Manifest.decode(store.get_manifest(store.head(name)))
                except StoreError as exc:  # not this check's to report: the session's own use is
                    log.warning("not counting session %s: %s", name, exc.message)
                    continue
                total += history.size(manifest)
        return total

    def _public_name(self, user: str, stored: str) -> str:
        """The name `user` knows their session by (`_store_name` undone)."""
        return stored[len(self._store_name(user, "")):]

    def _public(self, user: str, status: dict) -> dict:
        """A session's status as its user sees it: their name for it, and how long its running
        cell has gone unfollowed, if it has."""
        run = self._runs.get(status["session"])
        if run is not None and run.detached is not None and not run.targets:
            status = {**status, "detached": time.monotonic() - run.detached}
        return {**status, "session": self._public_name(user, status["session"])}

    def _scrape(self) -> dict:
        """What the metrics read at a scrape (in the HTTP server's thread), taken in the loop
        that changes it."""
        async def now() -> dict:
            return {"leases": self.leases.status(), "workers": len(self.pool.workers),
                    "zygotes": len(self.pool.zygotes),
                    "sessions": [s.status() for s in self.sessions.values()],
                    "sourced": dict(self.store.sourced),
                    "sourced_seconds": dict(self.store.sourced_seconds),
                    "replicated": self.store.replicated}

        if self._loop is None:
            raise RuntimeError("the server is not serving")
        return asyncio.run_coroutine_threadsafe(now(), self._loop).result(timeout=10)

    def status(self, user: str) -> dict:
        """The server as `user` may see it: their sessions, and others' only as busy slots."""
        mine = self._sessions_of(user)
        leases = self.leases.status()
        for entry in (*leases["leases"], *leases["queue"]):
            if "session" in entry:
                entry["session"] = (self._public_name(user, entry["session"])
                                    if entry["session"] in mine else "(another user's)")
        return {
            "pid": os.getpid(),
            "uptime": time.time() - self.started,
            "address": self.config.address,
            "store": str(self.config.store),
            "user": user,
            "leases": leases,
            **self.pool.status(),
            "upkeep": self.upkeep,
            "sourced": dict(self.store.sourced),  # bytes fetched from peers and the remote
            "sessions": [self._public(user, s.status()) for s in mine.values()],
        }


def _ended(task: asyncio.Task) -> None:
    """A loop of the server that ended other than by its stop: what ended it, in the log."""
    if not task.cancelled() and task.exception() is not None:
        log.error("a loop of the server failed", exc_info=task.exception())


def run(config: Config) -> None:
    """Serve until SIGTERM or SIGINT."""
    asyncio.run(Server(config).serve())

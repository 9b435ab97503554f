"""`llfabric serve`: the ROUTER socket clients talk to, in front of this host's sessions.

One asyncio loop serves every client: a request becomes a task, so a long cell of one session
never blocks another session's draft, an interrupt, or `status`. Whatever a request does wrong
ends as an error reply to it; the loop keeps serving.

Every connection is admitted as a user (`fabric.auth`: a CURVE key on tcp://, the OS user on
ipc://); each request, read and checked once here, goes to the host (`fabric.host`) as that
user's, and its typed reply goes back as its final frame.

Clients are watched while their cells run: libzmq pings each connection every `heartbeat`
seconds and drops one silent for `heartbeat_timeout`. A running cell's frames go to the clients
that follow it (`fabric.host.runs`): one whose client is no longer connected runs on for
`detached_grace` seconds, its outputs kept, so that another client can `follow` it. `stop`
stops a session's cell whichever client ran it; `close` only from a client that follows the
cell.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import zmq

from . import auth, stacks
from .cluster.peers import Peers, PeerServer
from .config import Config
from .errors import FabricError
from .following import Run
from .front import Front, failure, msg_id_of
from .host.face import Caller, call
from .host.local import LocalHost
from .messages import Close, Event, Execute, Follow, Followed, Request

log = logging.getLogger(__name__)


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        # refuses a bad address before anything starts
        self.front = Front(config, lambda: self.host.metrics.auth_failures.inc())
        self.host = LocalHost(config, self.front.send,
                              Peers(Path(config.peers)) if config.peers else None)
        self._stop = asyncio.Event()

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        async with self.front.bound():
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
            stacks.on_sigusr1(loop)
            metrics = self.host.metrics.serve(self.config.metrics_bind) \
                if self.config.metrics_bind else None
            # a cluster's host: its blobs, for its peers
            peers = PeerServer(self.host.store, self.config.peer_bind,
                               auth.Keys(self.config.key_dir / "peers")) \
                if self.config.peer_bind else None
            try:
                await self.host.start()
                log.info("serving on %s, store %s, %d %s slots", self.config.address,
                         self.config.store, self.host.leases.slots, self.host.leases.kind)
                if ready is not None:
                    ready.set()
                if peers is not None:
                    peers.start()
                await self._serving()
            finally:
                if metrics is not None:
                    metrics.shutdown()
                    metrics.server_close()
                if peers is not None:
                    peers.stop()
                await self.host.shut()

    def stop(self) -> None:
        self._stop.set()

    async def _serving(self) -> None:
        """Receive requests and run the host's loops until the server is stopped. One task
        group owns every task, each request's too: a stop cancels them all and waits for them
        to end, before the host shuts down."""
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(_logged(self._receive(tasks)))
                tasks.create_task(_logged(self.host.runs.watch(self.front.connected)))
                tasks.create_task(_logged(self.host.upkeep.serve()))
                await self._stop.wait()
                raise _Stopped
        except* _Stopped:
            pass

    async def _receive(self, tasks: asyncio.TaskGroup) -> None:
        while True:
            tasks.create_task(self._handle(await self.front.receive()))

    async def _handle(self, frames: list[zmq.Frame]) -> None:
        identity, msg_id = frames[0].bytes, msg_id_of(frames)
        try:
            user, message, request = self.front.read(frames)
            msg_id = message["msg_id"]  # a valid one, however far into the frame it was
            runs = self.host.runs
            if isinstance(request, Close):
                runs.check_close(self.host.tenancy.stored(user, request.session),
                                 request.session, identity)
            if isinstance(request, Follow):
                stored = self.host.session(user, request.session).name
                if not runs.follow(stored, identity, msg_id):
                    self.front.send(identity, Followed(False).to_wire(msg_id))
                return  # else the cell's frames come as it runs

            def emit(event: Event) -> None:
                if run is None:
                    self.front.send(identity, event.to_wire(msg_id))
                else:
                    run.emit(event.to_wire(""))

            run = self._start_run(user, request, identity, msg_id)
            if run is not None:
                run.admitted = self.front.admission(frames[1], user)
            try:
                final = (await call(self.host, Caller(user, emit), request)).to_wire(msg_id)
            except Exception as exc:  # the client hears of it; the server keeps serving
                if isinstance(exc, FabricError) and isinstance(request, Execute):
                    log.info("session %s: the cell did not commit: %s", request.session,
                             exc.message)  # its client shows it; the log says it too
                final = failure(exc, msg_id)
            if run is None:
                self.front.send(identity, final)
            else:
                still_open = self.host.sessions.get(run.session.name) is run.session
                runs.end(run, {k: v for k, v in final.items() if k != "msg_id"}, still_open)
        except Exception as exc:
            self.front.send(identity, failure(exc, msg_id))

    def _start_run(self, user: str, request: Request, identity: bytes,
                   msg_id: str) -> Run | None:
        """The `Run` of an execute of an open session not running a cell (see `Runs.start`)."""
        if not isinstance(request, Execute):
            return None
        session = self.host.sessions.get(self.host.tenancy.stored(user, request.session))
        return None if session is None else self.host.runs.start(session, identity, msg_id)


class _Stopped(Exception):
    """The server was told to stop: its task group cancels what it runs."""


async def _logged(loop: Coroutine[Any, Any, None]) -> None:
    """A loop of the server: one that fails is told in the log, and the others serve on."""
    try:
        await loop
    except Exception:
        log.exception("a loop of the server failed")


def run(config: Config) -> None:
    """Serve until SIGTERM or SIGINT."""
    asyncio.run(Server(config).serve())

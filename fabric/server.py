"""`llfabric serve`: the ROUTER socket clients talk to, and the sessions behind it.

One asyncio loop serves every client: a request becomes a task, so a long cell of one session
never blocks another session's draft, an interrupt, or `status`. Whatever a request does wrong
ends as an error reply to it; the loop keeps serving.

Clients are watched while their cells run: libzmq pings each connection every `heartbeat`
seconds and drops one silent for `heartbeat_timeout`; a running cell whose client is no longer
connected (gone, killed, or silent) is stopped, so that its lease comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

import zmq
import zmq.asyncio

from . import protocol
from .claim import claim_server
from .config import Config
from .errors import FabricError, InUse, ProtocolError, UnknownSession
from .pool import Leases, Pool, cuda
from .session import Session
from .snapshot import Store

log = logging.getLogger(__name__)


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.store = Store(config.store)
        self.leases = Leases.for_host(config.slots)
        source = config.worker_source
        if source == "auto":
            source = "template" if self.leases.kind == "gpu" else "zygote"
        self.pool = Pool(config.store, max_zygotes=config.max_zygotes, worker_source=source,
                         keep_warm=config.keep_warm, cool_after=config.cool_after,
                         zygote_memory=config.zygote_memory,
                         pressure_percent=config.memory_pressure)
        if self.leases.kind == "gpu":
            self.pool.cuda = cuda.find_driver()
            if self.pool.cuda is None:
                log.warning("no CUDA checkpoint driver: kept workers stay on their GPU")
        self.sessions: dict[str, Session] = {}
        self.started = time.time()
        self._tasks: set[asyncio.Task] = set()
        # the sessions whose cells run, by the (client, msg_id) of the execute that runs each
        self._executing: dict[tuple[bytes, str | None], Session] = {}
        self._stop = asyncio.Event()

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        context = zmq.asyncio.Context()
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.setsockopt(zmq.MAXMSGSIZE, 4 * self.config.max_frame)  # hard bound on memory
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone client fails
        if self.config.heartbeat > 0:
            self.socket.setsockopt(zmq.HEARTBEAT_IVL, self.config.heartbeat * 1000)
            self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.config.heartbeat_timeout * 1000)
        address = self.config.address
        if address.startswith("ipc://"):
            Path(address[len("ipc://"):]).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        claims = claim_server(self.config.store, address)  # InUse: another server has them
        try:
            self.socket.bind(address)
        except zmq.ZMQError as exc:  # a tcp:// port another process holds, say
            claims.release()
            raise InUse(f"cannot serve on {address}: {exc}", address=address) from exc
        except BaseException:
            claims.release()
            raise
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        try:
            await self.pool.start()
            log.info("serving on %s, store %s, %d %s slots", address, self.config.store,
                     self.leases.slots, self.leases.kind)
            if ready is not None:
                ready.set()
            receiver = asyncio.ensure_future(self._receive())
            watcher = asyncio.ensure_future(self._watch_clients())
            await self._stop.wait()
            receiver.cancel()
            watcher.cancel()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self.pool.stop()
            self.socket.close()
            context.term()
            if address.startswith("ipc://"):  # ours: the claim kept any other server off it
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address[len("ipc://"):])
            claims.release()

    def stop(self) -> None:
        self._stop.set()

    async def _receive(self) -> None:
        while True:
            frames = await self.socket.recv_multipart(copy=True)
            task = asyncio.ensure_future(self._handle(frames))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _send(self, identity: bytes, message: dict) -> None:
        """Send now or drop, as a ROUTER does: a client that does not read (its queue full) or
        has gone must never hold up the replies to the others."""
        self.socket.send_multipart([identity, protocol.pack(message)],
                                   flags=zmq.NOBLOCK).add_done_callback(_undelivered)

    def _connected(self, identity: bytes) -> bool:
        probe = self.socket.send_multipart([identity, HEARTBEAT], flags=zmq.NOBLOCK)
        probe.add_done_callback(_undelivered)
        return not (probe.done() and isinstance(probe.exception(), zmq.ZMQError)
                    and probe.exception().errno == zmq.EHOSTUNREACH)

    async def _watch_clients(self) -> None:
        """Stop the cells of clients that are no longer connected."""
        while True:
            await asyncio.sleep(self.config.heartbeat or 1)
            for (identity, _), session in list(self._executing.items()):
                if not self._connected(identity):
                    log.warning("session %s: its client went away; stopping its cell",
                                session.name)
                    session.stop("client")

    async def _handle(self, frames: list[bytes]) -> None:
        identity, msg_id = frames[0], None
        try:
            if len(frames) != 2:
                raise ProtocolError(f"expected one payload frame, got {len(frames) - 1}")
            message = protocol.unpack(frames[1], self.config.max_frame)
            msg_id = message.get("msg_id") if isinstance(message.get("msg_id"), str) else None
            protocol.check_request(message)

            def emit(payload: dict, event: str = "output") -> None:
                fields = {"output": payload} if event == "output" else payload
                self._send(identity, protocol.event(msg_id, event, **fields))

            call = (identity, msg_id)
            if message["op"] == "execute" and message["session"] in self.sessions:
                self._executing[call] = self.sessions[message["session"]]
            try:
                result = await self._dispatch(message, emit)
            finally:
                self._executing.pop(call, None)
            self._send(identity, protocol.reply(msg_id, **result))
        except FabricError as exc:
            self._send(identity, protocol.error(msg_id, exc.to_wire()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: the client hears of it, the server keeps serving
            log.exception("request failed")
            self._send(identity, protocol.error(msg_id, {
                "kind": "internal", "message": f"{type(exc).__name__}: {exc}"}))

    def _session(self, name: str) -> Session:
        session = self.sessions.get(name)
        if session is None:
            raise UnknownSession(f"no open session {name!r}; open it first", session=name)
        return session

    async def _dispatch(self, message: dict, emit) -> dict:
        op = message["op"]
        if op == "ping":
            return {"pong": True, "pid": os.getpid()}
        if op == "status":
            return self.status()
        name = message["session"]
        if op == "open":
            session = self.sessions.get(name)
            if session is None:
                cwd = message.get("cwd") or os.getcwd()
                if not os.path.isdir(cwd):
                    raise FabricError(f"working directory {cwd!r} does not exist", session=name)
                session = Session(name, cwd, self.store, self.pool, self.leases,
                                  interrupt_grace=self.config.interrupt_grace)
                self.sessions[name] = session
            return session.status()
        session = self._session(name)
        if op == "draft":
            return session.draft(message["source"])
        if op == "execute":
            return await session.execute(message["source"], emit, stdin=message.get("stdin", False))
        if op == "interrupt":
            return {"interrupted": session.interrupt()}
        if op == "input":
            return session.answer(message.get("value"), message.get("error"))
        if op == "checkout":
            return session.checkout(message["version"])
        if op == "close":
            await session.close()
            del self.sessions[name]
            return {"closed": True, "version": session.manifest.version}
        raise ProtocolError(f"unknown op {op!r}")  # check_request lets no other op through

    def status(self) -> dict:
        return {
            "pid": os.getpid(),
            "uptime": time.time() - self.started,
            "address": self.config.address,
            "store": str(self.config.store),
            "leases": self.leases.status(),
            **self.pool.status(),
            "sessions": [s.status() for s in self.sessions.values()],
        }


HEARTBEAT = protocol.pack({"type": "heartbeat"})  # no msg_id: clients drop it


def _undelivered(sent: asyncio.Future) -> None:
    """A frame to a client that has gone away, or reads too slowly, is dropped, not an error."""
    if sent.exception() is not None:
        log.info("a frame to a client was dropped: %s", sent.exception())


def run(config: Config) -> None:
    """Serve until SIGTERM or SIGINT."""
    asyncio.run(Server(config).serve())

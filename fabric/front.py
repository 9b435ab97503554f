"""The socket clients connect to: a ROUTER bound to the configured address, each connection
admitted as a user (`fabric.auth`), frames sent now or dropped.

A single host's server and a cluster's front door (`fabric.cluster.door`) both face clients
through one: the same address rules, keys and heartbeats, so a client cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import typing
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import zmq
import zmq.asyncio

from . import auth, protocol
from .claim import claim_server
from .config import Config
from .errors import AddressRefused, FabricError, Forbidden, InUse, ProtocolError
from .messages import Error, Heartbeat, Request
from .private import private_dir

log = logging.getLogger(__name__)

HEARTBEAT = protocol.pack(Heartbeat().to_wire())


class Front:
    def __init__(self, config: Config, refused: Callable[[], None] = lambda: None) -> None:
        self.config = config
        self.keys = check_address(config)  # refused before anything starts
        self.refused = refused  # told of each connection turned away
        self.socket: zmq.asyncio.Socket | None = None

    @contextlib.asynccontextmanager
    async def bound(self) -> AsyncIterator[Front]:
        """Bound and admitting, until the block ends; InUse if another server has the address
        or the store."""
        context = zmq.asyncio.Context()
        authenticator = auth.Authenticator(context, self.keys, self.refused)
        admitting = asyncio.ensure_future(authenticator.serve())
        socket = self.socket = context.socket(zmq.ROUTER)
        socket.linger = 0
        socket.setsockopt(zmq.MAXMSGSIZE, protocol.WIRE_LIMIT)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone client fails
        if self.config.heartbeat > 0:
            socket.setsockopt(zmq.HEARTBEAT_IVL, self.config.heartbeat * 1000)
            socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.config.heartbeat_timeout * 1000)
        socket.zap_domain = auth.DOMAIN  # every connection, ipc too, passes the handler
        if self.keys is not None:
            public, secret = self.keys.server_pair()
            socket.curve_server = True
            socket.curve_publickey = public.encode()
            socket.curve_secretkey = secret.encode()
        address = self.config.address
        claims = claim_server(self.config.store, address)  # InUse: another server has them
        try:
            try:
                socket.bind(address)
            except zmq.ZMQError as exc:  # a tcp:// port another process holds, say
                raise InUse(f"cannot serve on {address}: {exc}", address=address) from exc
            yield self
        finally:
            admitting.cancel()
            socket.close()
            authenticator.close()
            context.term()
            if address.startswith("ipc://"):  # ours: the claim kept any other server off it
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address[len("ipc://"):])
            claims.release()

    def _bound(self) -> zmq.asyncio.Socket:
        if self.socket is None:
            raise RuntimeError("the front is used outside its bound() block")
        return self.socket

    async def receive(self) -> list[zmq.Frame]:
        return await self._bound().recv_multipart(copy=False)

    def _send_now(self, frames: list[bytes]) -> asyncio.Future[object]:
        # the cast: pyzmq's stubs say an Awaitable, zmq.asyncio returns a Future
        return typing.cast("asyncio.Future[object]",
                           self._bound().send_multipart(frames, flags=zmq.NOBLOCK))

    def send(self, identity: bytes, message: protocol.Wire | bytes) -> None:
        """Send now or drop, as a ROUTER does: a client that does not read (its queue full) or
        has gone must never hold up the replies to the others."""
        frame = message if isinstance(message, bytes) else protocol.pack(message)
        self._send_now([identity, frame]).add_done_callback(_undelivered)

    def connected(self, identity: bytes) -> bool:
        """Whether the client is still connected (a heartbeat frame it ignores probes it)."""
        probe = self._send_now([identity, HEARTBEAT])
        probe.add_done_callback(_undelivered)
        error = probe.exception() if probe.done() else None
        return not (isinstance(error, zmq.ZMQError) and error.errno == zmq.EHOSTUNREACH)

    def read(self, frames: list[zmq.Frame]) -> tuple[str, protocol.Wire, Request]:
        """The user, message and request of a client's frames; a FabricError if they are not
        one request (`msg_id_of` names the request it answers, where it can)."""
        if len(frames) != 2:
            raise ProtocolError(f"expected one payload frame, got {len(frames) - 1}")
        message = protocol.unpack(frames[1].buffer, self.config.max_frame)
        user = self.user(frames[1])
        return user, message, Request.from_wire(message)

    def user(self, frame: zmq.Frame) -> str:
        """The user the connection was admitted as; a revoked key is refused at once."""
        user = _property(frame, "User-Id")
        if not user:  # the authenticator names every connection it admits
            raise Forbidden("the connection has no user")
        key = _property(frame, auth.KEY_PROPERTY)
        if self.keys is not None and not self.keys.admits(user, key):
            raise Forbidden(f"the key of user {user} is no longer authorized", user=user)
        return user


    def admission(self, frame: zmq.Frame, user: str) -> Callable[[], bool]:
        """Whether the key `frame` came with is still admitted, each time it is asked: a
        request may outlive its key (a cell runs on after a revoke)."""
        key = _property(frame, auth.KEY_PROPERTY)
        return lambda: self.keys is None or self.keys.admits(user, key)


def msg_id_of(frames: list[zmq.Frame]) -> str | None:
    """The msg_id of a client's frame, read so that even a refused frame is answered."""
    return protocol.peek_msg_id(frames[-1].buffer) if len(frames) > 1 else None


def failure(exc: Exception, msg_id: str | None) -> protocol.Wire:
    """The error frame answering a request that raised `exc`: a bug is logged, and the client
    hears of it too."""
    if isinstance(exc, FabricError):
        return Error(exc.to_wire()).to_wire(msg_id)
    log.error("request failed", exc_info=exc)
    return Error({"kind": "internal", "message": f"{type(exc).__name__}: {exc}"}).to_wire(msg_id)


def _property(frame: zmq.Frame, name: str) -> str:
    """A connection's metadata property on one of its frames ('' if it has none)."""
    try:
        value = frame.get(name)
    except zmq.ZMQError:
        return ""
    return value if isinstance(value, str) else ""


def check_address(config: Config) -> auth.Keys | None:
    """Refuse an address only the wrong clients could reach; the keys a tcp:// bind admits."""
    address = config.address
    if address.startswith("ipc://"):
        # the runtime dir is private; a socket elsewhere may be shared with other local users
        # (granted access to it), each of whom is then the user their uid names
        folder = Path(address[len("ipc://"):]).parent
        private_dir(folder, shared=folder != Path(config.runtime_dir))
        return None
    if not address.startswith("tcp://"):
        raise AddressRefused(f"cannot serve on {address}: use ipc:// or tcp://",
                             address=address)
    keys = auth.Keys(config.key_dir)
    keys.server_pair()  # made on the first start
    if not keys.users():
        raise AddressRefused(
            f"refusing to serve {address} without client keys: a tcp:// bind admits only "
            f"clients whose public keys are in {keys.authorized}. Make one with `llfabric keys "
            "new NAME` and give NAME the file it writes", address=address)
    return keys


def _undelivered(sent: asyncio.Future[object]) -> None:
    """A frame to a client that has gone away, or reads too slowly, is dropped, not an error."""
    if sent.exception() is not None:
        log.info("a frame to a client was dropped: %s", sent.exception())

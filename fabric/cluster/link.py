"""One client's connection to one host of a cluster, as that client's user (`fabric.cluster.door`).

The host admits the door's key for the user, so it keeps the user's sessions apart and sees this
connection, and the client behind it, exactly as if the client had connected itself. Events go
straight on to the client; each request's final frame comes back to the door.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq
import zmq.asyncio

from .. import protocol
from ..auth import ClientKey
from ..errors import FabricError
from ..messages import Error, Request
from ..tasks import Background

log = logging.getLogger(__name__)


class Link:
    """One client's connection to one host, as the client's user: its events go straight to the
    client (`relay`); each request's final frame comes back to the caller."""

    def __init__(self, context: zmq.asyncio.Context, host: str, address: str, key: ClientKey,
                 relay: Callable[[bytes], None]) -> None:
        """To the host named `host`, at `address`."""
        self.host, self.user = host, key.user
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.setsockopt(zmq.MAXMSGSIZE, protocol.WIRE_LIMIT)
        key.apply(self.socket)
        self.socket.connect(address)
        self.relay = relay
        self.pending: dict[str, tuple[asyncio.Future[protocol.Wire], Request]] = {}
        self._tasks = Background(f"the link to host {host}")
        self._tasks.start(self._read(), "reading its frames")

    async def call(self, message: protocol.Wire, request: Request) -> protocol.Wire:
        """Send a request's frame; its final frame."""
        future: asyncio.Future[protocol.Wire] = asyncio.get_running_loop().create_future()
        self.pending[message["msg_id"]] = (future, request)
        try:
            await self.socket.send(protocol.pack(message))
            return await future
        finally:
            self.pending.pop(message["msg_id"], None)

    async def _read(self) -> None:
        while True:
            frame = await self.socket.recv()
            try:
                message = protocol.unpack(frame, protocol.WIRE_LIMIT)
            except FabricError:
                log.warning("host %s sent a frame that is not a message", self.host)
                continue
            kind, msg_id = message.get("type"), message.get("msg_id")
            waiting = self.pending.get(msg_id) if isinstance(msg_id, str) else None
            if kind in ("reply", "error") and waiting is not None:
                if not waiting[0].done():
                    waiting[0].set_result(message)
            elif kind != "heartbeat":  # the door probes its clients itself
                self.relay(frame)

    def fail(self, error: Callable[[Request], FabricError]) -> None:
        """End every request in flight with `error(request)`'s frame."""
        for msg_id, (future, request) in list(self.pending.items()):
            if not future.done():
                future.set_result(Error(error(request).to_wire()).to_wire(msg_id))

    def close(self) -> None:
        self._tasks.cancel()  # the reader: it ends at once, on a socket closed under it
        self.socket.close()

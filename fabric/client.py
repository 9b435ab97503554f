"""A synchronous client of `llfabric serve`: one DEALER socket, requests by msg_id."""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Container, Iterator
from pathlib import Path
from typing import Any

import zmq

from . import protocol
from .auth import ClientKey, Keys
from .errors import FrameTooLarge, RemoteError, Unreachable
from .private import check_dir


class Client:
    """`key`: for a tcp:// address, default the client.key of the configured key_dir."""

    def __init__(self, address: str, timeout: float = 10.0, key: ClientKey | None = None) -> None:
        self.address = address
        self.timeout = timeout
        if address.startswith("tcp://") and key is None:
            from .config import load

            key = Keys(load().key_dir).client()
        elif address.startswith("ipc://"):
            _check_socket_dir(Path(address[len("ipc://"):]).parent)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.linger = 0
        if key is not None:
            key.apply(self.socket)
        self.socket.connect(address)
        self._ids = (f"{os.getpid()}-{n}" for n in itertools.count(1))

    def close(self) -> None:
        self.socket.close()
        self.context.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, op: str, **fields: Any) -> str:
        """Send a request without waiting; return its msg_id, for `receive`."""
        msg_id = next(self._ids)
        frame = protocol.pack({"op": op, "msg_id": msg_id, **fields})
        if len(frame) > protocol.WIRE_LIMIT:  # the server could not even answer it
            raise FrameTooLarge(f"a request of {len(frame)} bytes exceeds the limit of "
                                f"{protocol.WIRE_LIMIT}", size=len(frame),
                                limit=protocol.WIRE_LIMIT)
        self.socket.send(frame)
        return msg_id

    def receive(self, msg_ids: Container[str], wait: float) -> dict | None:
        """The next frame answering one of `msg_ids`, or None after `wait` seconds of silence.

        Frames answering other requests (late, abandoned) are dropped. An error frame raises
        RemoteError.
        """
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            if not self.socket.poll(None if left == math.inf else int(left * 1000)):
                return None
            message = protocol.unpack(self.socket.recv(), max_size=1 << 31)
            if message.get("msg_id") not in msg_ids:
                continue
            if message.get("type") == "error":
                raise RemoteError(message.get("error") or {})
            return message
        return None

    def stream(self, op: str, timeout: float | None = None, **fields: Any) -> Iterator[dict]:
        """Send a request; yield its events, then its reply. An error reply raises RemoteError.

        `timeout` bounds the silence between two frames (None: the client's default; 0: wait
        forever, as for a cell that computes quietly for hours).
        """
        msg_id = self.send(op, **fields)
        wait = self.timeout if timeout is None else timeout
        while True:
            message = self.receive({msg_id}, wait or math.inf)
            if message is None:
                raise Unreachable(f"no answer from {self.address} within {wait:.0f} s",
                                  address=self.address)
            yield message
            if message.get("type") == "reply":
                return

    def call(self, op: str, timeout: float | None = None, **fields: Any) -> dict:
        """A request whose events are not needed: return its reply."""
        *_, reply = self.stream(op, timeout=timeout, **fields)
        return reply

    def ping(self, timeout: float = 1.0) -> bool:
        try:
            self.call("ping", timeout=timeout)
        except Unreachable:
            return False
        return True


def _check_socket_dir(folder: Path) -> None:
    """Refuse a socket in a directory that another user (not root) owns or may write into:
    they could have put their own server there to receive our cells."""
    if folder.is_dir():
        check_dir(folder, owners={os.geteuid(), 0}, closed=0o022)

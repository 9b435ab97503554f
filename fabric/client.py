"""A synchronous client of `llfabric serve`: one DEALER socket, requests by msg_id."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import zmq

from . import protocol
from .errors import RemoteError, Unreachable


class Client:
    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = timeout
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(address)
        self._ids = (f"{os.getpid()}-{n}" for n in itertools.count(1))

    def close(self) -> None:
        self.socket.close()
        self.context.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stream(self, op: str, timeout: float | None = None, **fields: Any) -> Iterator[dict]:
        """Send a request; yield its events, then its reply. An error reply raises RemoteError.

        `timeout` bounds the silence between two frames (None: the client's default; 0: wait
        forever, as for a cell that computes quietly for hours).
        """
        msg_id = next(self._ids)
        self.socket.send(protocol.pack({"op": op, "msg_id": msg_id, **fields}))
        wait = self.timeout if timeout is None else timeout
        while True:
            if wait and not self.socket.poll(int(wait * 1000)):
                raise Unreachable(f"no answer from {self.address} within {wait:.0f} s",
                                  address=self.address)
            message = protocol.unpack(self.socket.recv(), max_size=1 << 31)
            if message.get("msg_id") != msg_id:
                continue  # a late answer to an abandoned request
            kind = message.get("type")
            if kind == "error":
                raise RemoteError(message.get("error") or {})
            yield message
            if kind == "reply":
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

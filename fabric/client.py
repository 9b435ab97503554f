"""A synchronous client of `llfabric serve`: one DEALER socket, one method per request.

Requests may overlap (an interrupt while a cell runs): frames are routed by msg_id, and those of a
request not being read yet wait for it.

The connection is watched (a ZeroMQ socket monitor) while the client waits: a server that went
away (its connection closed, or silent to the client's heartbeats for `HEARTBEAT_TIMEOUT`) fails
the requests it had not answered at once, as a restarted server knows nothing of them; a server
that refuses the client's key, or whose own key is not the one the client expects, is reported
as such rather than as silence.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import socket
import time
import weakref
from collections import deque
from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import messages, protocol
from .auth import ClientKey, Keys
from .errors import BadKey, FabricError, Forbidden, FrameTooLarge, Unreachable
from .messages import (
    Answer,
    CheckedOut,
    Checkout,
    Close,
    Closed,
    ClosureSummary,
    Draft,
    Event,
    Execute,
    Follow,
    InputAnswered,
    Interrupt,
    Interrupted,
    Open,
    Ping,
    Remove,
    Removed,
    Reply,
    Request,
    Status,
    Stop,
    Stopped,
    Tag,
    Tagged,
    VersionHistory,
    Versions,
)
from .private import check_dir
from .status import REPLIES, ServerStatus, SessionStatus

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Reply)

PATIENCE = 30.0  # seconds a server that listens may take to answer: a loaded host answers late
# ZMTP pings to the server every HEARTBEAT seconds; one silent for HEARTBEAT_TIMEOUT has gone
# (its libzmq answers them, so a server busy with cells still does)
HEARTBEAT = 2.0
HEARTBEAT_TIMEOUT = 10.0
_WATCHED = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)


def _close(dealer: zmq.Socket, monitor: zmq.Socket, context: zmq.Context) -> None:
    dealer.disable_monitor()
    monitor.close()
    dealer.close()
    context.term()


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
        self.socket.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT * 1000))
        self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(HEARTBEAT_TIMEOUT * 1000))
        self.key = key
        if key is not None:
            key.apply(self.socket)
        self._monitor = self.socket.get_monitor_socket(_WATCHED)
        self._poller = zmq.Poller()
        self._poller.register(self.socket, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._connected = False  # a handshake with the server succeeded and holds
        self.socket.connect(address)
        self._ids = (f"{os.getpid()}-{n}" for n in itertools.count(1))
        self._pending: dict[str, deque[protocol.Wire]] = {}  # frames of requests sent, not yet read
        # a client dropped unclosed closes too, sockets first: collected in another order, the
        # context's term would wait for them in whichever thread collects it
        self._finalizer = weakref.finalize(self, _close, self.socket, self._monitor, self.context)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, request: Request) -> str:
        """Send a request without waiting; return its msg_id, for `receive` or `events`."""
        msg_id = next(self._ids)
        frame = protocol.pack(request.to_wire(msg_id))
        if len(frame) > protocol.WIRE_LIMIT:  # the server could not even answer it
            raise FrameTooLarge(f"a request of {len(frame)} bytes exceeds the limit of "
                                f"{protocol.WIRE_LIMIT}", size=len(frame),
                                limit=protocol.WIRE_LIMIT)
        self._watch()  # a connection lost before now fails no request sent from now on
        try:
            self.socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # no connection takes it: wait for one, within the client's timeout
            deadline = time.monotonic() + self.timeout
            while not self.socket.poll(100, zmq.POLLOUT):
                self._watch()
                if time.monotonic() > deadline:
                    raise Unreachable(f"no server at {self.address} takes requests",
                                      address=self.address) from None
            self.socket.send(frame, zmq.NOBLOCK)
        self._pending[msg_id] = deque()
        return msg_id

    def _watch(self) -> None:
        """Read what the monitor saw of the connection: a refusal raises; a lost connection
        fails the requests still awaited (Unreachable)."""
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected = True
            elif event == zmq.EVENT_DISCONNECTED and self._connected:
                self._connected = False
                lost, self._pending = self._pending, {}
                if lost:
                    raise Unreachable(
                        f"the server at {self.address} went away before it answered (its "
                        "connection closed, or it stopped answering heartbeats): what it was "
                        "doing for this client is lost, a cell's session stays at its last "
                        "committed version", address=self.address)
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise Forbidden(
                    f"the server at {self.address} refuses this client"
                    + (f"'s key (user {self.key.user}): it was revoked or never admitted; "
                       "ask the server's admin for a key (`llfabric keys new NAME`)"
                       if self.key is not None else ""), address=self.address)
            elif event != zmq.EVENT_DISCONNECTED and self.key is not None:
                raise BadKey(f"the server at {self.address} failed the CURVE handshake: its "
                             "key is not the server key in this client's key file (a key for "
                             "another server, or the server's key was made again)",
                             address=self.address)

    def receive(self, msg_ids: Collection[str], wait: float) -> protocol.Wire | None:
        """The next frame answering one of `msg_ids`, or None after `wait` seconds of silence;
        an error frame raises RemoteError.

        Frames of the other requests still awaited are kept for them, in order; heartbeats and
        the frames of requests given up on (`forget`) are dropped.
        """
        message = self._frame(msg_ids, wait)
        if message is not None and message.get("type") == "error":
            messages.from_server(message, Reply)  # raises
        return message

    def _frame(self, msg_ids: Collection[str], wait: float) -> protocol.Wire | None:
        for msg_id in msg_ids:
            if self._pending.get(msg_id):
                return self._settled(self._pending[msg_id].popleft())
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            ready = dict(self._poller.poll(None if left == math.inf else int(left * 1000)))
            if self._monitor in ready:
                self._watch()
            if self.socket not in ready:
                continue
            message = protocol.unpack(self.socket.recv(), max_size=1 << 31)
            msg_id = message.get("msg_id")
            if not isinstance(msg_id, str):  # a heartbeat, or an answer to no request of ours
                continue
            if msg_id in msg_ids:
                return self._settled(message)
            if msg_id in self._pending:
                self._pending[msg_id].append(message)
        return None

    def _settled(self, message: protocol.Wire) -> protocol.Wire:
        """A request's final frame ends the wait for it."""
        if message.get("type") in ("reply", "error"):
            self.forget(message["msg_id"])
        return message

    def forget(self, msg_id: str) -> None:
        """No longer await `msg_id`: what still comes for it is dropped."""
        self._pending.pop(msg_id, None)

    def events(self, msg_id: str, answer: type[Reply], timeout: float | None = None,
               probe: bool = False) -> Events:
        """The answer to request `msg_id`: its events, typed, then its reply, an `answer`.

        `timeout` bounds the silence between two frames (None: the client's default; 0: wait
        forever). With `probe`, silence is not failure while the server answers a ping: a cell
        may compute quietly for hours.
        """
        wait = self.timeout if timeout is None else timeout
        return Events(self, msg_id, answer, wait or math.inf, probe)

    def start(self, request: Request, timeout: float | None = None) -> Events:
        """Send `request`; its events and reply to iterate. A cell's silence is probed: it may
        compute quietly for hours."""
        return self.events(self.send(request), REPLIES[request.op], timeout,
                           probe=isinstance(request, Execute | Follow))

    def request(self, request: Request, timeout: float | None = None) -> Reply:
        """Send `request`, wait for its reply (its events are not needed)."""
        *_, reply = self.start(request, timeout)
        assert isinstance(reply, Reply)  # the answer ends with it, else raised
        return reply

    def ask(self, request: Request, answer: type[R], timeout: float | None = None) -> R:
        """`request`'s reply, an `answer` (the reply type of its op)."""
        reply = self.request(request, timeout)
        if not isinstance(reply, answer):
            raise TypeError(f"op {request.op!r} is answered by {type(reply).__name__}")
        return reply

    def call(self, op: str, timeout: float | None = None, **fields: Any) -> Reply:
        """A request named by its op, as a magic or a script names it: its reply
        (`status.REPLIES`)."""
        return self.request(messages.request(op, **fields), timeout)

    # one method per request
    def open(self, session: str, cwd: str | None = None, env: str | None = None,
             ) -> SessionStatus:
        """Open (or rejoin) `session`; with `env`, its next cells run in that environment
        ("": the server's packages)."""
        return self.ask(Open(session, cwd, env), SessionStatus)

    def draft(self, session: str, source: str, timeout: float | None = None) -> ClosureSummary:
        return self.ask(Draft(session, source), ClosureSummary, timeout)

    def execute(self, session: str, source: str, *, stdin: bool = False,
                cell_id: str | None = None, gpus: int | None = None,
                execution_count: int | None = None, parent_id: str | None = None,
                timeout: float | None = None) -> Events:
        """Start a cell (with `gpus`, the session's GPU count from it on; with
        `execution_count`, its prompt number; with `parent_id`, a frontend's request);
        iterate the result for its outputs and notices, then its Reply."""
        return self.start(Execute(session, source, stdin, cell_id, gpus, execution_count,
                                  parent_id), timeout)

    def follow(self, session: str, timeout: float | None = None) -> Events:
        """Follow the session's running cell, whose client went away (or the reply of one that
        ended with none): its outputs so far, its live ones, then its Reply (`followed` false:
        there was none)."""
        return self.start(Follow(session), timeout)

    def interrupt(self, session: str) -> bool:
        """Interrupt the session's running cell; False if none ran."""
        return self.ask(Interrupt(session), Interrupted).interrupted

    def stop(self, session: str, timeout: float | None = None) -> bool:
        """Stop the session's running cell, whichever client ran it, and wait until it is
        over; False if none ran."""
        return self.ask(Stop(session), Stopped, timeout).stopped

    def answer(self, session: str, value: str | None = None,
               error: str | None = None) -> InputAnswered:
        return self.ask(Answer(session, value, error), InputAnswered)

    def checkout(self, session: str, version: int | str) -> CheckedOut:
        return self.ask(Checkout(session, version), CheckedOut)

    def close_session(self, session: str, timeout: float | None = None) -> Closed:
        return self.ask(Close(session), Closed, timeout)

    def tag(self, session: str, name: str, version: int | str | None = None) -> Tagged:
        return self.ask(Tag(session, name, version), Tagged)

    def versions(self, session: str, timeout: float | None = None) -> tuple[dict, ...]:
        """The session's versions, newest first, described for a history view."""
        return self.ask(Versions(session), VersionHistory, timeout).versions

    def remove(self, session: str) -> Removed:
        return self.ask(Remove(session), Removed)

    def status(self) -> ServerStatus:
        return self.ask(Status(), ServerStatus)

    def ping(self, timeout: float = 1.0) -> bool:
        """Whether a server answers at the address within `timeout` seconds."""
        try:
            self.request(Ping(), timeout)
        except Unreachable:
            return False
        return True

    def answers(self) -> bool:
        """Whether a server answers: within a second, or, if one listens at the address (up,
        but busy on a loaded host), within PATIENCE seconds more."""
        return self.ping() or (listening(self.address) and self.ping(timeout=PATIENCE))


class Events:
    """The frames answering one request, as messages: events, then the Reply (an error frame
    raises RemoteError). Iteration may go on after a KeyboardInterrupt between two frames.

    Requests about the one answered (an interrupt, an input answer, a probing ping) are sent
    with `send`: their replies are read and dropped here, their errors logged.
    """

    def __init__(self, client: Client, msg_id: str, answer: type[Reply], wait: float,
                 probe: bool) -> None:
        self.client = client
        self.msg_id = msg_id
        self.answer = answer
        self.wait = wait
        self.probe = probe
        self.done = False
        self._side: set[str] = set()
        self._ping: str | None = None
        self._heard = time.monotonic()

    def send(self, request: Request) -> None:
        self._side.add(self.client.send(request))

    def __iter__(self) -> Events:
        return self

    def __next__(self) -> Event | Reply:
        while not self.done:
            frame = self.client._frame({self.msg_id, *self._side},
                                       self._heard + self.wait - time.monotonic())
            if frame is None:
                self._silent()
                continue
            self._heard = time.monotonic()
            if frame["msg_id"] != self.msg_id:
                self._aside(frame)
                continue
            try:
                message = messages.from_server(frame, self.answer)
            except FabricError:
                self.close()
                raise
            if isinstance(message, Reply):
                self.close()
            return message
        raise StopIteration

    def _aside(self, frame: protocol.Wire) -> None:
        """The answer to a request sent with `send` (or a probe): done once it is final."""
        if frame.get("type") not in ("reply", "error"):
            return
        self._side.discard(frame["msg_id"])
        if frame["msg_id"] == self._ping:
            self._ping = None
        try:
            if frame["type"] == "error":  # its reply is not read
                messages.from_server(frame, Reply)  # raises
        except FabricError as exc:
            log.warning("a request about request %s failed: %s", self.msg_id, exc.message)

    def _silent(self) -> None:
        """`wait` seconds without a frame: probe the server, or give up."""
        if self.probe and self._ping is None:
            self._ping = self.client.send(Ping())
            self._side.add(self._ping)
            self._heard = time.monotonic()
            return
        self.close()
        address = self.client.address
        raise Unreachable(f"no answer from {address} within {self.wait:.0f} s", address=address)

    def close(self) -> None:
        """No longer await the answer: what still comes for it is dropped."""
        self.done = True
        for msg_id in (self.msg_id, *self._side):
            self.client.forget(msg_id)


def listening(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts connections at `address`: a server that does not answer a
    ping but listens is up and busy, not down."""
    try:
        if address.startswith("ipc://"):
            with socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(timeout)
                probe.connect(address[len("ipc://"):])
        elif address.startswith("tcp://"):
            host, _, port = address[len("tcp://"):].rpartition(":")
            socket.create_connection((host.strip("[]"), int(port)), timeout).close()
        else:
            return False
    except (OSError, ValueError):
        return False
    return True


def _check_socket_dir(folder: Path) -> None:
    """Refuse a socket in a directory that another user (not root) owns or may write into:
    they could have put their own server there to receive our cells."""
    if folder.is_dir():
        check_dir(folder, owners={os.geteuid(), 0}, closed=0o022)

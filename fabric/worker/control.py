"""The server <-> zygote wire: every message of a zygote's control channel, defined once.

Layer 1: one SOCK_SEQPACKET unix socket per zygote; one packet is one message, and the
descriptors a message carries travel with its packet (SCM_RIGHTS). Layer 2: the packet is one
msgpack map, its `op` naming the message, its other keys the message's fields.

  server -> zygote  ForkWorker    {op: fork_worker, endpoint, store, req}  -> Forked
                    ForkZygote    {op: fork_zygote, modules, site, req}    -> ZygoteForked
  zygote -> server  Forked        {op: forked, req, pid}
                    ZygoteForked  {op: zygote, req, pid} + the new zygote's control socket
                    ZygoteRefused {op: refused, req, error}  a request it could not read
                    Ready         {op: ready, pid, imported, failed}  once, after its imports
                    Exited        {op: exited, pid, status}  a child of this zygote ended

Both ends read with `receive` (or `decode`), which accepts only the messages that end is sent,
each with exactly its fields, of their types, and its descriptors: anything else is a
`ZygoteProtocolError`, never dropped. A zygote answers one with `ZygoteRefused` (`req` the
request's when it had a readable one) and goes on serving; the server fails the request it
answers. A zygote that sends one is broken: the server kills it and fails what waited on it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar, Self, TypeVar

import msgpack

from .. import typed
from ..errors import ZygoteProtocolError
from ..protocol import Wire

PACKET = 1 << 20  # largest control packet
MAX_FDS = 4  # descriptors read with a packet; more are a refusal, never a leak


@dataclass(frozen=True)
class ZygoteMessage:
    """One message: its `op`, its fields (the dataclass's), the descriptors sent with it."""

    op: ClassVar[str]
    fds: ClassVar[int] = 0  # descriptors that travel with the message

    def to_wire(self) -> Wire:
        return {"op": self.op, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_wire(cls, wire: dict) -> Self:
        """The message `wire` holds, refused unless it has exactly this message's fields, each of
        its type: a peer of another version, or a broken one, fails here rather than later."""
        hints = typed.fields(cls)
        extra = [key for key in wire if key != "op" and key not in hints]
        if extra:
            raise _refusal(wire, f"{cls.op} has unknown fields {extra}")
        if missing := [name for name in hints if name not in wire]:
            raise _refusal(wire, f"{cls.op} lacks its field {missing[0]!r}")
        try:
            return cls(**typed.record(cls, wire, cls.op))
        except typed.Mismatch as exc:
            raise _refusal(wire, str(exc)) from None


@dataclass(frozen=True)
class Forked(ZygoteMessage):
    op: ClassVar[str] = "forked"
    req: int
    pid: int


@dataclass(frozen=True)
class ZygoteForked(ZygoteMessage):
    op: ClassVar[str] = "zygote"
    fds: ClassVar[int] = 1  # the new zygote's control socket
    req: int
    pid: int


@dataclass(frozen=True)
class ZygoteRefused(ZygoteMessage):
    op: ClassVar[str] = "refused"
    req: int | None
    error: str


@dataclass(frozen=True)
class Ready(ZygoteMessage):
    op: ClassVar[str] = "ready"
    pid: int
    imported: list[str]
    failed: dict[str, str]  # module -> why its import failed


@dataclass(frozen=True)
class Exited(ZygoteMessage):
    op: ClassVar[str] = "exited"
    pid: int
    status: int  # as os.waitpid reports it


@dataclass(frozen=True)
class ForkWorker(ZygoteMessage):
    op: ClassVar[str] = "fork_worker"
    answer: ClassVar[type[Forked]] = Forked
    endpoint: str
    store: str
    req: int = 0  # set by the server as it sends the request


@dataclass(frozen=True)
class ForkZygote(ZygoteMessage):
    op: ClassVar[str] = "fork_zygote"
    answer: ClassVar[type[ZygoteForked]] = ZygoteForked
    modules: list[str]  # what the new zygote imports, beyond its parent's
    site: str = ""  # an environment's site-packages it enters first (`env.enter`); "": none
    req: int = 0


M = TypeVar("M", bound=ZygoteMessage)

TO_ZYGOTE = (ForkWorker, ForkZygote)
TO_SERVER = (Forked, ZygoteForked, ZygoteRefused, Ready, Exited)
ANSWERS = (Forked, ZygoteForked, ZygoteRefused)  # what answers a request, by its req


def send(ctrl: socket.socket, message: ZygoteMessage, fds: Sequence[int] = ()) -> None:
    # msgpack is untyped, and pyright reads a None into packb's result (see protocol.pack)
    data: bytes = msgpack.packb(  # pyright: ignore[reportAssignmentType]
        message.to_wire(), use_bin_type=True)
    if fds:
        socket.send_fds(ctrl, [data], list(fds))
    else:
        ctrl.send(data)


def receive(ctrl: socket.socket, accepted: tuple[type[M], ...]) -> tuple[M, list[int]] | None:
    """The next message on `ctrl`, one of `accepted`, with its descriptors; None once the peer
    has closed. Raises what `recv` raises (BlockingIOError on a non-blocking socket)."""
    try:
        data, fds, flags, _ = socket.recv_fds(ctrl, PACKET, MAX_FDS)
    except ConnectionResetError:  # closed with our packets unread: closed all the same
        return None
    if not data:
        _close(fds)
        return None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        _close(fds)
        raise ZygoteProtocolError(f"a control packet over {PACKET} bytes or {MAX_FDS} "
                                  f"descriptors", limit=PACKET)
    return decode(data, fds, accepted), fds


def decode(data: bytes, fds: list[int], accepted: tuple[type[M], ...]) -> M:
    """The message one packet holds, if it is one of `accepted` with the descriptors it carries;
    otherwise ZygoteProtocolError, the descriptors closed."""
    try:
        try:
            wire = msgpack.unpackb(data, raw=False)
        except (ValueError, msgpack.UnpackException) as exc:
            raise ZygoteProtocolError(f"a control packet that is not msgpack ({exc!r})") from exc
        if not isinstance(wire, dict):
            raise ZygoteProtocolError(f"a control packet holding a {type(wire).__name__}, "
                                      f"not a map")
        kind = next((k for k in accepted if k.op == wire.get("op")), None)
        if kind is None:
            raise _refusal(wire, f"unknown op {wire.get('op')!r}; this end is sent "
                                 f"{', '.join(k.op for k in accepted)}")
        if len(fds) != kind.fds:
            raise _refusal(wire, f"{kind.op} came with {len(fds)} descriptors, not {kind.fds}")
        return kind.from_wire(wire)
    except ZygoteProtocolError:
        _close(fds)
        raise


def _refusal(wire: dict, message: str) -> ZygoteProtocolError:
    """The error about `wire`, naming its op and req (when readable) so that it can be answered."""
    req = wire.get("req")
    return ZygoteProtocolError(message, op=wire.get("op"),
                               req=req if type(req) is int else None)


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)

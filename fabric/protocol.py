"""The wire format between clients, the server and workers.

Layer 1 (ZeroMQ): a client's DEALER talks to the server's ROUTER; the ROUTER sees
``[identity, payload]``, the DEALER sees ``[payload]``. A worker has a PAIR socket of its own.
Layer 2 (payload): one msgpack map per frame.

Requests carry ``op``, ``session`` and ``msg_id``. The server answers each request with zero or more
``event`` frames (outputs of a running cell, progress) and exactly one final frame, ``reply`` or
``error``, all carrying the request's ``msg_id``.

Events of an ``execute``: ``output`` (an nbformat output in ``output``), ``queued`` (the cell
waits for a lease), ``leased`` (it got one, after ``waited`` seconds) and ``input_request``
(``prompt``, ``password``: the cell called input() or getpass(); answered by an ``input``
request of the same session, only when the execute said ``stdin: true``) and ``notice``
(``topic``, ``text``, ``time``: what llfabric says about itself, never a cell output; see
`fabric.notices`).

While a client's cell runs, the server probes it with ``{type: heartbeat}`` frames (no msg_id:
clients drop them) and ZMTP pings; a client gone or silent has its cell stopped.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .errors import FrameTooLarge, ProtocolError

MAX_FRAME = 16 * 1024 * 1024  # requests are source text and small maps; outputs may carry images
# What ZeroMQ itself lets through, a bound on the memory one message takes: a frame over
# `max_frame` but under this gets a `frame_too_large` reply; a client never sends more.
WIRE_LIMIT = 1 << 30

CLIENT_OPS = frozenset({"open", "draft", "execute", "interrupt", "input", "checkout", "close",
                        "tag", "rm", "status", "ping"})

# Ops and the fields each requires, besides op and msg_id.
REQUIRED = {
    "open": ("session",),
    "draft": ("session", "source"),
    "execute": ("session", "source"),
    "interrupt": ("session",),
    "input": ("session",),  # the answer to a running cell's input(): `value`, or `error`
    "checkout": ("session", "version"),  # a version number, or a name `tag` gave one
    "close": ("session",),
    "tag": ("session", "name"),  # name `version` (default: the head): retention keeps it
    "rm": ("session",),  # remove the session from the store, refused while a cell runs
    "status": (),
    "ping": (),
}


def pack(message: dict) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpack(frame: bytes, max_size: int = MAX_FRAME) -> dict:
    """Decode one frame into a map, refusing anything that is not one."""
    if len(frame) > max_size:
        raise FrameTooLarge(f"frame of {len(frame)} bytes exceeds the limit of {max_size}",
                            size=len(frame), limit=max_size)
    try:
        message = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"frame is not valid msgpack: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"frame is a {type(message).__name__}, not a map")
    return message


def peek_msg_id(frame: bytes | memoryview, window: int = 64 << 10) -> str | None:
    """The string `msg_id` of a map frame, read from its first bytes only: the request of a
    frame too large (or too malformed) to decode still gets its error reply."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
    unpacker.feed(frame[:window])
    try:
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() == "msg_id":
                msg_id = unpacker.unpack()
                return msg_id if isinstance(msg_id, str) else None
            unpacker.skip()
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData):
        pass
    return None


def check_request(message: dict) -> dict:
    """Validate a client request; return it unchanged or raise ProtocolError."""
    op = message.get("op")
    if not isinstance(op, str):
        raise ProtocolError("request has no 'op'")
    if op not in CLIENT_OPS:
        raise ProtocolError(f"unknown op {op!r}", op=op)
    if not isinstance(message.get("msg_id"), str):
        raise ProtocolError("request has no string 'msg_id'", op=op)
    for field in REQUIRED[op]:
        if field not in message:
            raise ProtocolError(f"op {op!r} needs field {field!r}", op=op)
    for field in ("session", "source", "cwd", "cell_id", "value", "error", "name"):
        if field in message and not isinstance(message[field], str):
            raise ProtocolError(f"field {field!r} must be a string", op=op)
    if "stdin" in message and not isinstance(message["stdin"], bool):
        raise ProtocolError("field 'stdin' must be a boolean", op=op)
    if "version" in message and (not isinstance(message["version"], int | str)
                                 or isinstance(message["version"], bool)):
        raise ProtocolError("field 'version' must be an integer or a name", op=op)
    session = message.get("session")
    if session is not None and not valid_session_name(session):
        raise ProtocolError(
            "session names are 1-128 characters of letters, digits, '-', '_' and '.'", op=op
        )
    return message


def valid_session_name(name: str) -> bool:
    return (
        0 < len(name) <= 128
        and not name.startswith(".")
        and all(_allowed(c) for c in name)
    )


def as_session_name(text: str, length: int = 100) -> str:
    """A valid session name made of any text (a notebook's file name): each character a name
    may not hold becomes '_'."""
    name = "".join(c if _allowed(c) else "_" for c in text)
    return name.lstrip(".")[:length] or "notebook"


def _allowed(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c in "-_.")


def event(msg_id: str, kind: str, **fields: Any) -> dict:
    return {"type": "event", "msg_id": msg_id, "event": kind, **fields}


def reply(msg_id: str, **fields: Any) -> dict:
    return {"type": "reply", "msg_id": msg_id, **fields}


def error(msg_id: str | None, err: dict) -> dict:
    return {"type": "error", "msg_id": msg_id, "error": err}

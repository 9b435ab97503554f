"""The framing of every wire: clients and the server, the server and its workers.

Layer 1 (ZeroMQ): a client's DEALER talks to the server's ROUTER; the ROUTER sees
``[identity, payload]``, the DEALER sees ``[payload]``. A worker has a PAIR socket of its own.
Layer 2 (payload): one msgpack map per frame, at most `MAX_FRAME` bytes. What the maps hold is
defined once per wire: `fabric.messages` (client <-> server), `fabric.worker.messages`.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import msgpack

from .errors import FrameTooLarge, ProtocolError

MAX_FRAME = 16 * 1024 * 1024  # requests are source text and small maps; outputs may carry images
# What ZeroMQ itself lets through, a bound on the memory one message takes: a frame over
# `max_frame` but under this gets a `frame_too_large` reply; a client never sends more.
WIRE_LIMIT = 1 << 30
# One map as a wire carries it (a frame's message, a Jupyter message's content, an nbformat
# output): its keys name fields, whose values its reader checks (`typed.record`); the framing
# knows no more of it.
Wire = dict[str, Any]


def is_map(value: object) -> TypeGuard[Wire]:
    """Whether `value` is a map as a wire carries it (msgpack decodes its keys as strings)."""
    return isinstance(value, dict)


def pack(message: Wire) -> bytes:
    # the ignores: msgpack is untyped, and pyright reads a None into packb's result from its
    # pure-Python fallback's `pack`, whose packb always returns bytes
    try:
        return msgpack.packb(message, use_bin_type=True)  # pyright: ignore[reportReturnType]
    except UnicodeEncodeError:  # a lone surrogate (a cell printed one): sent replaced, as a
        # kernel's streams show it, since UTF-8 cannot carry it
        return msgpack.packb(  # pyright: ignore[reportReturnType]
            message, use_bin_type=True, unicode_errors="replace")


def unpack(frame: bytes | memoryview, max_size: int = MAX_FRAME) -> Wire:
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

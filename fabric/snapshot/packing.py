"""msgpack, typed: the store's own records (object indexes, session indexes, catalogs) to bytes
and back. msgpack ships no types, so its calls are wrapped here, once."""

from __future__ import annotations

from typing import cast

import msgpack  # pyright: ignore[reportMissingTypeStubs]

UnpackError = msgpack.UnpackException  # what `unpack` raises for bytes that are not msgpack


def pack(value: object) -> bytes:
    # its pure-Python fallback's packb reads as returning None: it returns bytes
    return cast(bytes, msgpack.packb(value, use_bin_type=True))  # pyright: ignore[reportUnknownMemberType]


def unpack(data: bytes | memoryview) -> object:
    """What `data` holds, to be checked by its reader: it is input from outside."""
    return cast(object, msgpack.unpackb(data, raw=False))  # pyright: ignore[reportUnknownMemberType]

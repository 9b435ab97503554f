"""Where a cell's code lives for a debugger: a file named by a hash of the cell's source.

A worker compiles each cell under this name, and the debugger's breakpoints name the same file,
so a frontend maps a frame back to its cell by hashing the cell's text the same way (the Jupyter
debug protocol's `debugInfo` tells it the hash, its seed, and the name's prefix and suffix).
The prefix holds no pid: every worker of a session (and the server, which writes the files a
debugger reads) names a cell alike, so a function defined in one worker keeps its breakpoints
in the next.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

SEED = 0xC70F6907  # the seed Python kernels give the hash: any seed works, `debugInfo` says it
SUFFIX = ".py"
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(text: str, seed: int = SEED) -> int:
    """MurmurHash2 (32-bit) of `text`'s UTF-8 bytes: the hash JupyterLab names cells by (every
    cell a worker runs is named by it: the words are unpacked at once, for speed)."""
    data = text.encode()
    whole = len(data) & ~3
    h = (seed ^ len(data)) & _MASK
    for k in struct.unpack(f"<{whole // 4}I", data[:whole]):
        k = k * _M & _MASK
        k ^= k >> 24
        h = (h * _M ^ k * _M) & _MASK
    if tail := data[whole:]:
        h = (h ^ int.from_bytes(tail, "little")) * _M & _MASK
    h = (h ^ (h >> 13)) * _M & _MASK
    return h ^ (h >> 15)


def prefix() -> str:
    """The folder of the cell files, ending in a separator (one per OS user: each writes its
    own)."""
    return os.path.join(tempfile.gettempdir(), f"llfabric_cells_{os.getuid()}", "")


def path(code: str) -> str:
    """The file name cell `code` is compiled under."""
    return f"{prefix()}{murmur2(code)}{SUFFIX}"


def dump(code: str) -> str:
    """Write `code` to its file (a debugger sets breakpoints only in files that exist); its
    path."""
    name = Path(path(code))
    name.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not name.is_file() or name.read_text(encoding="utf-8") != code:
        partial = name.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(code, encoding="utf-8")
        partial.replace(name)  # whole, for a debugger reading it meanwhile
    return str(name)

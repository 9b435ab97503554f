"""Output written straight to a file descriptor (C code, `os.system`, subprocesses) as stream text.

The worker's fd 1 and 2 become pipes whose reader feeds the cell's stdout and stderr streams, as a
Jupyter kernel does. At the end of a cell, `drain` flushes C stdio and writes a marker through
the pipe; when the reader reaches the marker, everything written before it has been forwarded.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import threading

from .shell import OutStream

_MARKER = b"\x00llfabric-drain\x00"
_libc = ctypes.CDLL(None)


def _held_back(data: bytes) -> int:
    """How many trailing bytes could be the start of a marker cut by a read boundary."""
    for size in range(min(len(_MARKER) - 1, len(data)), 0, -1):
        if _MARKER.startswith(data[-size:]):
            return size
    return 0


class FdCapture:
    def __init__(self, fd: int, stream: OutStream) -> None:
        self._fd = fd
        self._stream = stream
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self._read_end = read_end
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._drained = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True, name=f"fd{fd}-capture")
        self._thread.start()
        stream.before_flush = self.drain

    def _emit(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        if text:
            self._stream.write(text)

    def _pump(self) -> None:
        pending = b""
        while data := os.read(self._read_end, 65536):
            pending += data
            while (at := pending.find(_MARKER)) >= 0:
                self._emit(pending[:at])
                pending = pending[at + len(_MARKER):]
                self._drained.set()
            keep = _held_back(pending)
            self._emit(pending[: len(pending) - keep])
            pending = pending[len(pending) - keep:]

    def drain(self, timeout: float = 2.0) -> None:
        """Return once everything written to the fd so far has reached the stream."""
        if threading.current_thread() is self._thread:
            return  # the reader itself is writing: it is draining already
        _libc.fflush(None)
        self._drained.clear()
        os.write(self._fd, _MARKER)
        self._drained.wait(timeout)

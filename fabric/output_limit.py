"""A cell's outputs kept within a limit, as JupyterLab limits what a cell shows.

Every place a cell's outputs pass through keeps at most `OUTPUT_LIMIT` bytes of them (the
server, from its worker; `llfabric run` and the attached kernel, from the server), so that a
cell printing without end leaves each process's memory flat. Past the limit a stream's text is
cut where the limit falls and later outputs are counted, not kept; at the cell's end one stderr
stream says how much was left out. An error output (the cell's traceback) and a clear_output
always pass: they are what the user must see, and small.
"""

from __future__ import annotations

from . import protocol
from .protocol import Wire

OUTPUT_LIMIT = 16 * 1024 * 1024  # bytes of a cell's outputs kept
SUMMARY = "[llfabric: output limit reached"  # how a summary's text begins


class Budget:
    """What one cell's outputs may still take; `admit` each output in order."""

    def __init__(self, limit: int = OUTPUT_LIMIT) -> None:
        self.limit = limit
        self.used = 0
        self.left_out = 0  # bytes of outputs not kept
        self.outputs_left_out = 0
        self._summary_passed = False  # an earlier hop's summary, let through once

    def admit(self, output: Wire) -> Wire | None:
        """`output` as kept (a stream's text cut to what fits), or None when past the limit."""
        kind = output.get("output_type")
        if kind in ("error", "clear_output"):
            return output
        if kind == "stream":
            text = str(output.get("text", ""))
            if text.startswith(SUMMARY) and not self._summary_passed:
                self._summary_passed = True  # the server's summary, not the cell's own
                return output
            size = len(text.encode(errors="replace"))
            if self.used + size <= self.limit:
                self.used += size
                return output
            kept = _cut(text, self.limit - self.used)
            self.used = self.limit
            self._leave_out(size - len(kept.encode(errors="replace")))
            return {**output, "text": kept} if kept else None
        size = _size(output)
        if self.used + size <= self.limit:
            self.used += size
            return output
        self.used = self.limit  # later, smaller outputs do not slip in out of order
        self._leave_out(size)
        return None

    def summary(self) -> Wire | None:
        """The stderr stream that says what was left out, if anything was."""
        if not self.left_out:
            return None
        return {"output_type": "stream", "name": "stderr", "text": (
            f"{SUMMARY}: {self.left_out:,} more bytes in {self.outputs_left_out:,} outputs "
            f"of this cell were not kept (the limit is {self.limit:,} bytes per cell)]\n")}

    def _leave_out(self, size: int) -> None:
        self.left_out += size
        self.outputs_left_out += 1


def _cut(text: str, room: int) -> str:
    """The longest start of `text` within `room` bytes of UTF-8."""
    head = text[:max(room, 0)]  # no character is under a byte: the cut falls within it
    return head.encode(errors="replace")[:max(room, 0)].decode(errors="ignore")


def _size(output: Wire) -> int:
    return len(protocol.pack(output))

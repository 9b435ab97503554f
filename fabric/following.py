"""A cell that outlives its client: the frames of a running execute, for whoever follows it.

Each execute the server runs is a `Run`. Its frames go to the clients that follow it (first the
one that sent it) and into a bounded copy, so that a client that comes later (a kernel started
again after the one that ran the cell died) can `follow` the cell: it gets that copy, then the
live frames, then the cell's final frame. A cell whose last client went away keeps running for
the server's `detached_grace` seconds; its final frame, if nobody took it, is kept for the next
follower. Past `KEEP_BYTES` the copy keeps the newest frames, and a follower is told, with a
`dropped` notice, how many were not kept. A cell's input requests are never kept: a follower
could not answer one that is over, and a cell that asks while no client follows it is answered
as when stdin is not available. Of a cell's outputs, only `output_limit` bytes go out at all
(`fabric.output_limit`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable

from . import notices, protocol
from .errors import FabricError
from .messages import Output
from .output_limit import OUTPUT_LIMIT, Budget
from .session import Session

log = logging.getLogger(__name__)

KEEP_BYTES = 16 * 1024 * 1024  # of a cell's frames kept for a later follower
MERGED_BYTES = 64 * 1024  # a stream's consecutive text is kept as one output up to this size
NO_STDIN = ("input() was called while no client followed the cell (the one that ran it went "
            "away), so nothing can answer it")

Send = Callable[[bytes, protocol.Wire], None]


class Run:
    """One execute in progress: where its frames go, and what a later follower gets."""

    def __init__(self, session: Session, send: Send, limit: int = KEEP_BYTES,
                 output_limit: int = OUTPUT_LIMIT) -> None:
        self.session = session
        self._send = send
        self.limit = limit
        self.budget = Budget(output_limit)  # what of the cell's outputs goes out at all
        # the clients that follow it: identity -> (msg_id of their request, whether it was a
        # follow rather than the execute)
        self.targets: dict[bytes, tuple[str, bool]] = {}
        self.frames: deque[tuple[dict, int]] = deque()  # event maps (no msg_id), their sizes
        self.size = 0
        self.dropped = 0
        self.final: dict | None = None  # its reply or error map (no msg_id), once over
        self.detached: float | None = None  # when its last client went away (monotonic)
        self.stopping = False
        # whether the key of the user who ran it is still admitted: a revoke stops the cell
        self.admitted: Callable[[], bool] = lambda: True

    def attach(self, identity: bytes, msg_id: str, follow: bool = True) -> None:
        """`identity` follows the cell from now; with `follow`, it first gets what was kept
        (and the final frame, if the cell is over)."""
        if follow:
            if self.dropped:
                self._to(identity, msg_id, {"type": "event", "event": "notice", **notices.notice(
                    "dropped", f"{self.dropped} earlier outputs of this cell were not kept "
                    f"(past {self.limit} bytes)")})
            for frame, _ in self.frames:
                self._to(identity, msg_id, frame)
            if self.final is not None:
                self._to(identity, msg_id, self._final_for(self.final, follow))
                return
        self.targets[identity] = (msg_id, follow)
        self.detached = None

    def emit(self, frame: protocol.Wire) -> None:
        """An event of the cell (its wire map, without msg_id)."""
        if frame.get("event") == "input_request":
            if not self.targets:
                self.no_stdin()
        else:
            if frame.get("event") == "output":
                output = self.budget.admit(frame["output"])
                if output is None:
                    return
                frame = {**frame, "output": output}
            self._keep(frame)
        for identity, (msg_id, _) in list(self.targets.items()):
            self._to(identity, msg_id, frame)

    def finish(self, frame: protocol.Wire) -> bool:
        """The cell's final frame (reply or error), after what its outputs left out, if
        anything; False if no client was there to take it."""
        if (summary := self.budget.summary()) is not None:
            self.emit(Output(summary).to_wire(""))
        self.final = frame
        taken = bool(self.targets)
        for identity, (msg_id, follow) in self.targets.items():
            self._to(identity, msg_id, self._final_for(frame, follow))
        self.targets.clear()
        return taken

    def prune(self, connected: Callable[[bytes], bool]) -> bool:
        """Forget the clients no longer connected; True if this left none."""
        gone = [identity for identity in self.targets if not connected(identity)]
        for identity in gone:
            del self.targets[identity]
        return bool(gone) and not self.targets

    def no_stdin(self) -> None:
        """Answer the cell's pending input request, if any, as stdin not available does."""
        with contextlib.suppress(FabricError):  # none pending
            self.session.answer(None, NO_STDIN)

    def _to(self, identity: bytes, msg_id: str, frame: dict) -> None:
        self._send(identity, {**frame, "msg_id": msg_id})

    @staticmethod
    def _final_for(frame: dict, follow: bool) -> dict:
        """A follower's reply says that it followed a cell (`followed`)."""
        return {**frame, "followed": True} if follow and frame.get("type") == "reply" else frame

    def _keep(self, frame: dict) -> None:
        """Keep `frame` for a later follower: consecutive text of one stream as one output (as
        a notebook shows it, and fewer frames to send at once), the newest within `limit`
        bytes."""
        output = frame.get("output") if frame.get("event") == "output" else None
        if (output is not None and output.get("output_type") == "stream" and self.frames
                and _stream(self.frames[-1][0]) == output.get("name")
                and self.frames[-1][1] < MERGED_BYTES):
            last, size = self.frames.pop()
            text = str(output.get("text", ""))
            last = {**last, "output": {**last["output"],
                                       "text": last["output"]["text"] + text}}
            self.size -= size
            frame, grown = last, size + len(text.encode())
        else:
            grown = len(protocol.pack(frame))
        self.frames.append((frame, grown))
        self.size += grown
        while self.size > self.limit and len(self.frames) > 1:
            _, size = self.frames.popleft()
            self.size -= size
            self.dropped += 1


def _stream(frame: dict) -> str | None:
    """The name of the stream a kept frame's output writes to, if it is one."""
    output = frame.get("output")
    if frame.get("event") == "output" and isinstance(output, dict) \
            and output.get("output_type") == "stream":
        return output.get("name")
    return None

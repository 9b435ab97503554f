"""The attached kernel's debugger: a frontend's `debug_request`s (JupyterLab's debugger panel)
go to the session on the server, which serves them against the debugpy of the worker running the
session's cell (`pool.debugging`); that debugger's events come back among the running cell's
events and go out as the kernel's `debug_event`s (`relay`).

Debug requests come on the kernel's control thread, also while the main thread waits for a cell
stopped at a breakpoint: they go through a client of their own, never the running cell's.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, NotRequired, TypedDict, cast

from ..client import Client
from ..errors import FabricError
from ..messages import Debug, Debugged
from .attached import Attached

TIMEOUT = 40.0  # seconds a debug request waits for the server (its worker's debugger: 30)


class DebugResponse(TypedDict):
    """A debug adapter protocol response: a kernel's `debug_reply` content."""

    type: str
    seq: int
    request_seq: int
    command: str | None
    success: bool
    message: NotRequired[str]
    body: NotRequired[dict[str, Any]]


class Debugging:
    """The kernel's debug requests, for one attachment; `install` takes the kernel's handler,
    `uninstall` gives it back."""

    def __init__(self, attachment: Attached) -> None:
        self.attachment = attachment
        self._client: Client | None = None
        self._lock = threading.Lock()  # the client is used by one request at a time

    def install(self) -> None:
        self.attachment.kernel.do_debug_request = self.request

    def uninstall(self) -> None:
        self.attachment.kernel.__dict__.pop("do_debug_request", None)
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    async def request(self, content: dict) -> DebugResponse:
        """The `debug_reply` content answering `content`, a debug adapter request."""
        try:
            return await asyncio.to_thread(self._call, content)
        except FabricError as exc:
            return {"type": "response", "seq": 0, "request_seq": content.get("seq", 0),
                    "command": content.get("command"), "success": False,
                    "message": f"llfabric: {exc.message}", "body": {}}

    def _call(self, content: dict) -> DebugResponse:
        with self._lock:
            if self._client is None:
                self._client = Client(self.attachment.address, timeout=TIMEOUT)
            reply = self._client.ask(Debug(self.attachment.session, content), Debugged,
                                     TIMEOUT)
        return cast(DebugResponse, reply.content)  # the worker's debugpy's, as it answered

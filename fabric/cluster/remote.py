"""A host of a cluster as its front door calls it: the host face (`fabric.host.face`) over one
client's link to that host (`link.Link`).

The door read and checked the client's frame once; the request goes on typed, encoded again for
the link, under the client's msg_id: the host's events for it go straight to the client, and its
final frame comes back here, read (and checked) as the op's reply, or raised as its error.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import RemoteError
from ..host.face import Caller
from ..messages import (
    Answer,
    CellHistory,
    CheckedOut,
    Checkout,
    Close,
    Closed,
    ClosureSummary,
    CommMessage,
    Complete,
    Completion,
    Debug,
    Debugged,
    Delivered,
    Draft,
    Drain,
    Drained,
    Emigrate,
    Emigrated,
    Error,
    Execute,
    Executed,
    Follow,
    Followed,
    GivenUp,
    GiveUp,
    Held,
    History,
    Holds,
    Immigrate,
    Immigrated,
    InputAnswered,
    Inspect,
    Inspection,
    Interrupt,
    Interrupted,
    Open,
    Ping,
    Pong,
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
from ..status import ServerStatus, SessionStatus
from .link import Link

R = TypeVar("R", bound=Reply)
_ids = (f"door-{n}" for n in itertools.count(1))  # the door's own requests


class RemoteHost:
    """One host, through one client's link to it (`Caller.msg_id`: the client's request)."""

    def __init__(self, link: Callable[[Request], Awaitable[Link]]) -> None:
        """`link(request)`: the link to carry `request` on (raises if the host is lost)."""
        self.link = link

    async def _call(self, caller: Caller, request: Request, answer: type[R]) -> R:
        msg_id = caller.msg_id or next(_ids)
        link = await self.link(request)
        final = await link.call(request.to_wire(msg_id), request)
        if final.get("type") == "error":
            raise RemoteError(Error.from_wire(final).error)
        return answer.from_wire(final)

    async def open(self, caller: Caller, request: Open) -> SessionStatus:
        return await self._call(caller, request, SessionStatus)

    async def draft(self, caller: Caller, request: Draft) -> ClosureSummary:
        return await self._call(caller, request, ClosureSummary)

    async def execute(self, caller: Caller, request: Execute) -> Executed:
        return await self._call(caller, request, Executed)

    async def follow(self, caller: Caller, request: Follow) -> Followed:
        """The host's connection to the client answers it (`fabric.following`)."""
        return await self._call(caller, request, Followed)

    async def interrupt(self, caller: Caller, request: Interrupt) -> Interrupted:
        return await self._call(caller, request, Interrupted)

    async def stop(self, caller: Caller, request: Stop) -> Stopped:
        return await self._call(caller, request, Stopped)

    async def answer(self, caller: Caller, request: Answer) -> InputAnswered:
        return await self._call(caller, request, InputAnswered)

    async def checkout(self, caller: Caller, request: Checkout) -> CheckedOut:
        return await self._call(caller, request, CheckedOut)

    async def close(self, caller: Caller, request: Close) -> Closed:
        return await self._call(caller, request, Closed)

    async def tag(self, caller: Caller, request: Tag) -> Tagged:
        return await self._call(caller, request, Tagged)

    async def remove(self, caller: Caller, request: Remove) -> Removed:
        return await self._call(caller, request, Removed)

    async def complete(self, caller: Caller, request: Complete) -> Completion:
        return await self._call(caller, request, Completion)

    async def inspect(self, caller: Caller, request: Inspect) -> Inspection:
        return await self._call(caller, request, Inspection)

    async def comm(self, caller: Caller, request: CommMessage) -> Delivered:
        return await self._call(caller, request, Delivered)

    async def debug(self, caller: Caller, request: Debug) -> Debugged:
        return await self._call(caller, request, Debugged)

    async def history(self, caller: Caller, request: History) -> CellHistory:
        return await self._call(caller, request, CellHistory)

    async def versions(self, caller: Caller, request: Versions) -> VersionHistory:
        return await self._call(caller, request, VersionHistory)

    async def status(self, caller: Caller, request: Status) -> ServerStatus:
        return await self._call(caller, request, ServerStatus)

    async def ping(self, caller: Caller, request: Ping) -> Pong:
        return await self._call(caller, request, Pong)

    async def holds(self, caller: Caller, request: Holds) -> Held:
        return await self._call(caller, request, Held)

    async def drain(self, caller: Caller, request: Drain) -> Drained:
        return await self._call(caller, request, Drained)

    async def emigrate(self, caller: Caller, request: Emigrate) -> Emigrated:
        return await self._call(caller, request, Emigrated)

    async def immigrate(self, caller: Caller, request: Immigrate) -> Immigrated:
        return await self._call(caller, request, Immigrated)

    async def give_up(self, caller: Caller, request: GiveUp) -> GivenUp:
        return await self._call(caller, request, GivenUp)

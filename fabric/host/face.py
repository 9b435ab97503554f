"""What a host serves: one method per request (`fabric.messages`), each answered by its typed
reply (`status.REPLIES`).

A single host's server (`fabric.server`) calls its in-process host (`fabric.host.local`); a
cluster's front door calls each of its hosts through a link (`fabric.cluster.remote`), the same
face. A request reaches a host parsed once, by the edge that read the client's frame; `Caller`
says who sent it and where its events go. `follow` is not a host's: it is answered by the
connection that carries a running cell's frames (`fabric.following`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

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
    Event,
    Execute,
    Executed,
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

Emit = Callable[[Event], None]  # an event of the request, to its client


def _nowhere(event: Event) -> None:
    """The events of a request nobody reads."""


@dataclass(frozen=True)
class Caller:
    """Who sent a request, and where its events go."""

    user: str
    emit: Emit = _nowhere
    msg_id: str = ""  # the client's id of the request, which a remote host's events carry


class Host(Protocol):
    async def open(self, caller: Caller, request: Open) -> SessionStatus: ...
    async def draft(self, caller: Caller, request: Draft) -> ClosureSummary: ...
    async def execute(self, caller: Caller, request: Execute) -> Executed: ...
    async def interrupt(self, caller: Caller, request: Interrupt) -> Interrupted: ...
    async def stop(self, caller: Caller, request: Stop) -> Stopped: ...
    async def answer(self, caller: Caller, request: Answer) -> InputAnswered: ...
    async def checkout(self, caller: Caller, request: Checkout) -> CheckedOut: ...
    async def close(self, caller: Caller, request: Close) -> Closed: ...
    async def tag(self, caller: Caller, request: Tag) -> Tagged: ...
    async def remove(self, caller: Caller, request: Remove) -> Removed: ...
    async def complete(self, caller: Caller, request: Complete) -> Completion: ...
    async def inspect(self, caller: Caller, request: Inspect) -> Inspection: ...
    async def comm(self, caller: Caller, request: CommMessage) -> Delivered: ...
    async def debug(self, caller: Caller, request: Debug) -> Debugged: ...
    async def history(self, caller: Caller, request: History) -> CellHistory: ...
    async def versions(self, caller: Caller, request: Versions) -> VersionHistory: ...
    async def status(self, caller: Caller, request: Status) -> ServerStatus: ...
    async def ping(self, caller: Caller, request: Ping) -> Pong: ...
    async def holds(self, caller: Caller, request: Holds) -> Held: ...
    async def drain(self, caller: Caller, request: Drain) -> Drained: ...
    async def emigrate(self, caller: Caller, request: Emigrate) -> Emigrated: ...
    async def immigrate(self, caller: Caller, request: Immigrate) -> Immigrated: ...
    async def give_up(self, caller: Caller, request: GiveUp) -> GivenUp: ...


# the ops whose method is named otherwise
_METHODS = {"input": "answer", "rm": "remove"}


async def call(host: Host, caller: Caller, request: Request) -> Reply:
    """`request` to the method of `host` that serves its op."""
    return await getattr(host, _METHODS.get(request.op, request.op))(caller, request)

"""What a session hands its workers on a host (`agent.SessionWorkers`), and what it gets back, as
plain data: the cell and the head it runs on, where its events go, how it ran. The seam a cluster
cuts at: these cross hosts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import notices
from ..closure import CellPlan, Closure
from ..snapshot import Manifest
from ..worker.account import Account as Account  # the user a session's workers run as
from ..worker.messages import Done

log = logging.getLogger(__name__)

Emit = Callable[..., None]  # emit(payload, event="output"): an event of the running request


@dataclass(frozen=True)
class Head:
    """The version a cell runs on: its id in the store (None before the first cell)."""

    id: str | None
    manifest: Manifest


@dataclass(frozen=True)
class CellJob:
    """A cell for the session's workers to run: its plan and closure, and how to run it."""

    plan: CellPlan  # its source, analysed
    closure: Closure
    execution_count: int
    stdin: bool = False  # the client answers the cell's input()
    received: float = 0.0  # when the request came (monotonic): the visible delay's start
    slots: int = 1  # leased together: the session's GPU count
    parent_id: str | None = None  # the frontend's request (`messages.Execute`)


@dataclass(frozen=True)
class Ran:
    """How a cell went on this host, for the session's reply."""

    status: str
    ename: str | None
    unsaved: list[str]
    path: str  # the worker it ran on: draft, warm, pinned or cold, +load, +replay
    source: str  # where that worker came from: zygote, template, cool or cold
    timings: dict[str, float]
    start: str  # how it started, in the user's words (`how_started`)
    payload: list[dict] = field(default_factory=list)  # for the kernel's execute reply
    unneeded: list[str] = field(default_factory=list)  # only a branch not taken needed them


def how_started(path: str, restored: bool) -> str:
    """How a cell started, in the words its user reads (`%llfabric status`, a cell's indicator
    in JupyterLab): on a worker `prepared` for it while it was edited, one `warm` from the cell
    before, one `restored` from its image on disk (a cool worker), or a `cold` one made for it.
    `path`: the worker it ran on (`Ran.path`); `restored`: that worker was cool."""
    if restored:
        return "restored"
    return {"draft": "prepared", "cold": "cold"}.get(path.partition("+")[0], "warm")


class EventSink:
    """Where a request's events go: to its client (`emit`; None for a draft) and, for notices,
    to the session's record (`record`)."""

    def __init__(self, session: str, emit: Emit | None, record: Callable[[dict], None]) -> None:
        self.session, self.emit, self.record = session, emit, record

    def __call__(self, payload: dict, event: str = "output") -> None:
        if self.emit is not None:
            self.emit(payload, event)

    def notice(self, topic: str, text: str, lost: bool = False) -> None:
        """Tell the client what llfabric did, outside the cell's outputs (see `notices`); a
        `lost` notice also shows in the cell, as an error. Progress is shown, not kept."""
        item = notices.notice(topic, text)
        log.info("session %s: %s", self.session, text)
        if topic != "progress":
            self.record(item)
        self(item, "notice")
        if lost:
            self(notices.loss(text))


Commit = Callable[[Done], Head]  # folds a cell's report (its save) into a new head version

"""The comms a frontend extension (labextension/) holds with an attached kernel.

`llfabric.draft`: the frontend sends the source of the cell being edited, `{"source", "revision"}`,
as the user types; the latest revision is forwarded to the server's draft op, older ones are
dropped. `llfabric.status`: the kernel sends the session's status (`summary`) when the comm
opens, after each cell, every few seconds (tiers change between cells), and the tool's notices
as `{"notice": text, "topic": topic}` (`fabric.notices`), which the frontend shows as
notifications, one per topic, never in a cell's outputs, and, as each cell ends, how it started
as `{"started": {"cell_id", "execution_count", "start"}}` (prepared, warm, cold or restored,
`pool.cells.how_started`), which the frontend may show beside the cell's prompt.
`llfabric.history`: the kernel sends the session's versions (`Client.versions`) as
`{"versions": [...], "version": head}` when the comm opens, after each cell and when asked
(`{"op": "list"}`); `{"op": "checkout", "version": N}` checks version N out, as
`%llfabric checkout N` does, and is answered `{"checked_out": N, "version": M}` (with a
`warning` where N's packages differ from its environment's now) or `{"error": text}`, then the
versions again. `llfabric.running`: opened by a frontend as it connects to the kernel (a notebook
reopened after its tab closed, say), it is answered `{"running": null}`, or, while a cell runs,
`{"running": {"cell_id", "msg_id", "execution_count", "outputs", "next", "dropped", "source",
"after"}}`: the cell's id in the notebook (with its source, and `after`, the cell that ended
before it started, for a notebook that lacks it), its execute request's msg_id, and what the
kernel has published for it so far (`outputs`: `{"msg_type", "content", "seq"}`, the last
`KEEP_BYTES` of them; `dropped`: earlier ones were left out), so that the frontend shows them,
then appends the cell's live IOPub messages, which carry their `seq` in the message metadata
(`llfabric_seq`) from `next` on. When the cell ends, `{"done": {"msg_id", "execution_count",
"status"}}`: a frontend that did not send the request gets neither its execute_reply nor, from
the kernel's start, its `execute_input`. A frontend that opens it with `{"saved":
last_modified}` (its notebook file's, ISO 8601) is also answered `"unsaved"`: the cells that
ended since, each `{"cell_id", "execution_count", "source", "outputs", "after"}`, which a
notebook reloaded before it was saved does not have in its file (`EndedCells`).

All go through a thread with its own client of the server, so a slow answer never holds up the
kernel's shell, and a burst of keystrokes queued behind a running cell becomes one draft. The
comms' messages may come on any of the kernel's threads: the main shell's, or a subshell's
(JEP 91), on which the extension sends drafts so that they arrive while a cell runs (the main
thread then waits for the cell); what they hand the thread is taken under a lock, and the
client the running cell uses is never touched.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

from ..client import Client
from ..envs import describe_differences
from ..errors import FabricError, RemoteError
from ..status import ServerStatus
from .attached import Attached
from .routing import is_local

log = logging.getLogger(__name__)

DRAFT_TARGET = "llfabric.draft"
STATUS_TARGET = "llfabric.status"
HISTORY_TARGET = "llfabric.history"
RUNNING_TARGET = "llfabric.running"
TARGETS = (DRAFT_TARGET, STATUS_TARGET, HISTORY_TARGET, RUNNING_TARGET)
# what a cell publishes that a reopened notebook shows again
OUTPUT_TYPES = frozenset({"stream", "display_data", "execute_result", "error", "clear_output",
                          "update_display_data"})
KEEP_BYTES = 4 * 2**20  # of a running cell's outputs kept for a frontend that comes back
POLL = 3.0  # seconds between status updates while nothing else asks for one


class StatusSummary(TypedDict):
    """What the status item shows (`summary`): the session; once it is open, where its worker
    is, its lease and its savings; `error` alone when the server did not answer."""

    session: str
    address: str
    open: NotRequired[bool]
    error: NotRequired[str]
    version: NotRequired[int]
    tier: NotRequired[str]
    pinned: NotRequired[bool]
    kind: NotRequired[str]
    lease: NotRequired[str]  # held, released or queued
    position: NotRequired[int | None]  # in the queue
    lease_seconds: NotRequired[float]
    saved_hours: NotRequired[float]
    saved_share: NotRequired[float]


class PublishedOutput(TypedDict):
    """One output the kernel published for a cell, in the order of `seq`."""

    seq: int
    msg_type: str
    content: dict[str, Any]


class CellSnapshot(TypedDict):
    """A running or ended cell as a frontend that comes back is sent it (`RunningCell`)."""

    cell_id: str | None
    msg_id: str | None
    execution_count: int
    next: int
    dropped: bool
    source: str
    after: str | None
    outputs: list[PublishedOutput]


def summary(status: ServerStatus, session: str) -> StatusSummary:
    """What the status item shows: the session, where its worker is, its lease, its savings."""
    mine = status.session(session)
    if mine is None:
        return {"session": session, "address": status.address, "open": False}
    leases = status.leases
    queue = [w.session for w in leases.queue]
    if session in queue:  # waiting for a slot (not yet `running`)
        lease, position = "queued", queue.index(session) + 1
    else:
        lease, position = ("held" if mine.running else "released"), None
    pinned_seconds = max(time.time() - mine.opened, mine.lease_seconds)
    saved = pinned_seconds - mine.lease_seconds
    return {"session": session, "address": status.address, "open": True,
            "version": mine.version, "tier": mine.tier, "pinned": mine.pinned,
            "kind": leases.kind, "lease": lease, "position": position,
            "lease_seconds": mine.lease_seconds, "saved_hours": saved / 3600,
            "saved_share": saved / pinned_seconds if pinned_seconds > 0 else 0.0}


class RunningCell:
    """The cell the kernel runs: where it is in the notebook, its request, its outputs so far;
    once it has ended, what a notebook reloaded before it was saved shows again."""

    def __init__(self, cell_id: str | None, msg_id: str | None, execution_count: int,
                 keep: int = KEEP_BYTES, source: str = "", after: str | None = None) -> None:
        self.cell_id = cell_id
        self.msg_id = msg_id
        self.execution_count = execution_count
        self.keep = keep
        self.source = source
        self.after = after  # the cell that ended before it started (`EndedCells.last`)
        self.ended: float | None = None  # when it ended (the epoch's seconds)
        self.outputs: deque[tuple[int, str, dict, int]] = deque()  # seq, type, content, size
        self.size = 0
        self.next = 0  # the seq of the next output
        self.dropped = False

    def record(self, msg_type: str, content: dict) -> int:
        """Keep an output (the last `keep` bytes of them); its seq."""
        seq, self.next = self.next, self.next + 1
        if msg_type == "clear_output" and not content.get("wait"):
            self.outputs.clear()  # what the frontend shows from here on starts empty
            self.size = 0
            self.dropped = False
            return seq
        try:
            size = len(json.dumps(content))
        except (TypeError, ValueError):
            return seq
        self.outputs.append((seq, msg_type, content, size))
        self.size += size
        while self.size > self.keep and self.outputs:
            self.size -= self.outputs.popleft()[3]
            self.dropped = True
        return seq

    def snapshot(self) -> CellSnapshot:
        return {"cell_id": self.cell_id, "msg_id": self.msg_id,
                "execution_count": self.execution_count, "next": self.next,
                "dropped": self.dropped, "source": self.source, "after": self.after,
                "outputs": [{"seq": seq, "msg_type": msg_type, "content": content}
                            for seq, msg_type, content, _ in self.outputs]}


class EndedCells:
    """The cells the kernel ran, the latest run of each, within `keep` bytes of outputs: those
    that ended after the notebook was last saved are not in its file, and a notebook reloaded
    (or reopened) shows them again rather than losing them."""

    def __init__(self, keep: int = KEEP_BYTES) -> None:
        self.keep = keep
        self.cells: deque[RunningCell] = deque()

    def last(self, cell_id: str | None) -> str | None:
        """The cell that `cell_id`, starting now, comes after: the last to end (a cell run
        again at once keeps its place)."""
        if not self.cells:
            return None
        last = self.cells[-1]
        return last.after if last.cell_id == cell_id else last.cell_id

    def add(self, cell: RunningCell) -> None:
        if cell.cell_id is None:  # not a notebook's cell: nowhere to show it again
            return
        self.cells = deque(c for c in self.cells if c.cell_id != cell.cell_id)
        self.cells.append(cell)
        while sum(c.size for c in self.cells) > self.keep:
            self.cells.popleft()

    def since(self, saved: float) -> list[CellSnapshot]:
        """The cells that ended after `saved`, in the order they ended."""
        return [c.snapshot() for c in self.cells if c.ended is not None and c.ended > saved]


def saved_time(value: object) -> float | None:
    """A notebook file's last_modified as the frontend has it (ISO 8601), in the epoch's
    seconds; None if it is no such time."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


class Frontend:
    """The comms of one attachment, and the thread that serves them."""

    def __init__(self, attachment: Attached) -> None:
        self.attachment = attachment
        self.comms: list[Any] = []  # open status comms
        self.history_comms: list[Any] = []  # open history comms
        self.running_comms: list[Any] = []  # open running-cell comms
        self.running: RunningCell | None = None  # the cell the kernel runs now
        self.ended = EndedCells()
        self._history_due = False  # the history comms are sent the versions at the next wake
        self._checkouts: list[tuple[Any, int | str]] = []  # asked for, not yet done
        self._draft: tuple[int, str] | None = None  # the newest revision not yet sent
        self._revision = -1
        self._wake = threading.Event()
        self._closed = False
        self._lock = threading.Lock()
        self._starting = threading.Lock()  # one thread, however many kernel threads nudge
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        manager = getattr(self.attachment.kernel, "comm_manager", None)
        if manager is None:
            return
        manager.register_target(DRAFT_TARGET, self._open_draft)
        manager.register_target(STATUS_TARGET, self._open_status)
        manager.register_target(HISTORY_TARGET, self._open_history)
        manager.register_target(RUNNING_TARGET, self._open_running)

    def close(self) -> None:
        manager = getattr(self.attachment.kernel, "comm_manager", None)
        if manager is not None:
            for target in TARGETS:
                manager.targets.pop(target, None)
        self._closed = True
        self._wake.set()

    # called on the kernel's threads
    def draft(self, source: str, revision: int | None = None) -> None:
        """Have `source` drafted, unless a newer revision came first."""
        with self._lock:
            if revision is not None:
                if revision <= self._revision:
                    return
                self._revision = revision
            self._draft = (self._revision, source)
        self._nudge()

    def notice(self, text: str, topic: str) -> None:
        """Tell the frontend (a slot wait, a value only the worker holds), and refresh its
        status."""
        for comm in list(self.comms):
            comm.send({"notice": text, "topic": topic})
        self.update()

    def started(self, cell_id: str | None, execution_count: int, start: object) -> None:
        """Tell the frontend how the notebook's cell `cell_id` started."""
        if cell_id and isinstance(start, str):
            for comm in list(self.comms):
                comm.send({"started": {"cell_id": cell_id, "execution_count": execution_count,
                                       "start": start}})

    def update(self) -> None:
        """Send the status and the versions soon (after a cell, say)."""
        if self.history_comms:
            self._history_due = True
        if self.comms or self.history_comms:
            self._nudge()

    # the running cell (its outputs come from the kernel's main thread, the comm on a subshell's)
    def cell_started(self, cell_id: str | None, msg_id: str | None, execution_count: int,
                     source: str = "") -> None:
        with self._lock:
            self.running = RunningCell(cell_id, msg_id, execution_count, source=source,
                                       after=self.ended.last(cell_id))

    def record(self, msg_type: str, content: dict) -> int | None:
        """Keep what the running cell publishes; its seq (None: not an output of a cell)."""
        with self._lock:
            if self.running is None or msg_type not in OUTPUT_TYPES:
                return None
            return self.running.record(msg_type, content)

    def cell_ended(self, execution_count: int, status: str) -> None:
        with self._lock:
            running, self.running = self.running, None
            comms, self.running_comms = self.running_comms, []  # each followed this cell
            if running is not None:
                running.execution_count, running.ended = execution_count, time.time()
                self.ended.add(running)
        if running is None:
            return
        done = {"msg_id": running.msg_id, "cell_id": running.cell_id,
                "execution_count": execution_count, "status": status}
        for comm in comms:
            comm.send({"done": done})

    def _open_running(self, comm: Any, message: dict) -> None:
        saved = saved_time((message.get("content", {}).get("data") or {}).get("saved"))
        with self._lock:
            running = None if self.running is None else self.running.snapshot()
            if running is not None:
                self.running_comms.append(comm)
            answer: dict = {"running": running}
            if saved is not None:
                answer["unsaved"] = self.ended.since(saved)
        comm.on_close(lambda msg: self.running_comms.remove(comm)
                      if comm in self.running_comms else None)
        comm.send(answer)

    def _open_draft(self, comm: Any, message: dict) -> None:
        def on_message(msg: dict) -> None:
            data = msg.get("content", {}).get("data") or {}
            revision = data.get("revision")
            if isinstance(data.get("source"), str):
                self.draft(data["source"], revision if isinstance(revision, int) else None)

        comm.on_msg(on_message)
        on_message(message)

    def _open_status(self, comm: Any, message: dict) -> None:
        self.comms.append(comm)
        comm.on_msg(lambda msg: self._nudge())  # any message asks for the status now
        comm.on_close(lambda msg: self.comms.remove(comm) if comm in self.comms else None)
        self._nudge()

    def _open_history(self, comm: Any, message: dict) -> None:
        def on_message(msg: dict) -> None:
            data = msg.get("content", {}).get("data") or {}
            version = data.get("version")
            if data.get("op") == "checkout" and isinstance(version, int | str) \
                    and not isinstance(version, bool):
                with self._lock:
                    self._checkouts.append((comm, version))
            self._history_due = True  # `list`, or the versions after a checkout
            self._nudge()

        self.history_comms.append(comm)
        comm.on_msg(on_message)
        comm.on_close(lambda msg: self.history_comms.remove(comm)
                      if comm in self.history_comms else None)
        self._history_due = True
        self._nudge()

    def _nudge(self) -> None:
        with self._starting:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._serve, name="llfabric-frontend",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    # the frontend thread
    def _serve(self) -> None:
        client = Client(self.attachment.address, timeout=5.0)
        try:
            while not self._closed:
                self._wake.wait(POLL)
                self._wake.clear()
                if self._closed:
                    break
                with self._lock:
                    draft, self._draft = self._draft, None
                    checkouts, self._checkouts = self._checkouts, []
                if draft is not None:
                    self._send_draft(client, draft[1])
                for comm, version in checkouts:
                    self._checkout(client, comm, version)
                if self.history_comms and (self._history_due or checkouts):
                    self._history_due = False
                    self._send_versions(client)
                if self.comms:
                    self._send_status(client)
        finally:
            client.close()

    def _send_draft(self, client: Client, source: str) -> None:
        if is_local(source) or not source.strip() or not self.attachment.opened:
            return
        try:
            client.draft(self.attachment.session, source)
        except FabricError as exc:  # a draft only saves time: the cell runs without it
            log.info("draft not sent: %s", exc.message)

    def _checkout(self, client: Client, comm: Any, version: int | str) -> None:
        """`%llfabric checkout VERSION`, asked from the history panel: the next cell runs on
        that version's state; prompt numbers go on."""
        try:
            reply = client.checkout(self.attachment.session, version)
        except FabricError as exc:  # a cell running, a thinned version, a server down
            comm.send({"error": exc.message, "version": version})
            return
        data: dict[str, Any] = {"checked_out": reply.checked_out, "version": reply.version}
        warnings = []
        if differ := reply.packages_differ:
            warnings.append(describe_differences(differ, reply.env))
        if closed := self.attachment.checked_out():
            warnings.append(closed)
        if warnings:
            data["warning"] = "\n".join(warnings)
        comm.send(data)

    def _send_versions(self, client: Client) -> None:
        try:
            versions = list(client.versions(self.attachment.session))
        except RemoteError as exc:
            if exc.kind != "unknown_session":
                versions, error = [], exc.message
            else:  # no cell has run yet: nothing in the store
                versions, error = [], None
        except FabricError as exc:
            versions, error = [], exc.message
        else:
            error = None
        data: dict = {"session": self.attachment.session, "versions": versions,
                      "version": versions[0]["version"] if versions else 0}
        if error is not None:
            data["error"] = error
        for comm in list(self.history_comms):
            comm.send(data)

    def _send_status(self, client: Client) -> None:
        data: StatusSummary
        try:
            data = summary(client.status(), self.attachment.session)
        except FabricError as exc:
            data = {"session": self.attachment.session, "address": self.attachment.address,
                    "error": exc.message}
        for comm in list(self.comms):
            comm.send({"status": data})

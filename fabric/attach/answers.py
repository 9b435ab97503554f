"""The attached kernel's answers to a frontend's requests other than execute, from the session
rather than the kernel process, which holds none of its state.

A frontend's messages to the comms a cell opened in the session's worker (a widget moved) go
to that worker through the server; what its callbacks output comes back as the kernel's own.

Completion and inspection go to the server, which asks the session's live worker, or answers
from the catalog of its head when none is live (`snapshot.catalog`). History is the session's
cells, read from its versions when the session opens and kept up as cells run, in a history
manager of the kernel's own that no other kernel writes to: `history_request`, `%history` and
`%recall` (run in the kernel, see `routing.LOCAL`) see this session's cells and no other's.
"""

from __future__ import annotations

import logging
from typing import Any, TypedDict, TypeVar, cast

from IPython.core.history import HistoryManager

from ..errors import FabricError, RemoteError
from ..messages import (
    CellHistory,
    Comm,
    Completion,
    Delivered,
    History,
    Inspection,
    Output,
    Reply,
    request,
)
from .attached import Attached

log = logging.getLogger(__name__)

ASK_TIMEOUT = 5.0  # seconds a completion or inspection waits for the server
COMM_TIMEOUT = 60.0  # seconds of silence a frontend's comm message waits for its callbacks
FORWARDED = ("comm_msg", "comm_close")


class CompleteReply(TypedDict):
    """A kernel's `complete_reply` content."""

    status: str
    matches: list[str]
    cursor_start: int
    cursor_end: int
    metadata: dict[str, Any]


class InspectReply(TypedDict):
    """A kernel's `inspect_reply` content."""

    status: str
    found: bool
    data: dict[str, Any]
    metadata: dict[str, Any]


Content = TypeVar("Content", CompleteReply, InspectReply)


class Answers:
    """What one attachment answers; `install` takes the kernel's handlers, `uninstall` gives
    them back."""

    def __init__(self, attachment: Attached) -> None:
        self.attachment = attachment
        self.shell = attachment.shell
        self.kernel = attachment.kernel
        self._own_history: HistoryManager | None = None
        self._kernel_history: HistoryManager | None = None
        # the comms the session's worker opened: id, the prompt of the cell that opened it
        self._comms: dict[str, int | None] = {}
        self._handlers: dict[str, Any] = {}  # the kernel's own, for its own comms

    def install(self) -> None:
        self.kernel.do_complete = self.complete
        self.kernel.do_inspect = self.inspect
        self._kernel_history = self.shell.history_manager
        self._fresh_history()
        handlers = getattr(self.kernel, "shell_handlers", {})
        for kind in FORWARDED:
            if kind in handlers:
                self._handlers[kind] = handlers[kind]
                handlers[kind] = self._comm_handler(handlers[kind])

    def uninstall(self) -> None:
        for name in ("do_complete", "do_inspect"):
            self.kernel.__dict__.pop(name, None)
        self.kernel.shell_handlers.update(self._handlers)
        self._handlers = {}
        if self._kernel_history is not None:
            self.shell.history_manager = self._kernel_history
            self._kernel_history = None
        if self._own_history is not None:
            self._own_history.close()
            self._own_history = None

    def _call(self, op: str, **fields: Any) -> Reply:
        return self.attachment.client.call(op, session=self.attachment.session,
                                           timeout=ASK_TIMEOUT, **fields)

    # completion and inspection
    def _ask(self, op: str, empty: Content, **fields: Any) -> Content:
        if not self.attachment.opened:
            return empty
        try:
            try:
                reply = self._call(op, **fields)
            except RemoteError as exc:
                if exc.kind != "unknown_session":
                    raise
                self.attachment.open()  # the server restarted: the session is in the store
                reply = self._call(op, **fields)
        except FabricError as exc:  # the frontend shows nothing, as for a name unknown
            log.info("llfabric: %s not answered: %s", op, exc.message)
            return empty
        if isinstance(reply, Completion | Inspection) and reply.status in ("ok", "error"):
            return cast(Content, reply.to_map())  # Jupyter's content, as the wire carries it
        return empty

    async def complete(self, code: str, cursor_pos: int | None) -> CompleteReply:
        cursor = len(code) if cursor_pos is None else cursor_pos
        empty: CompleteReply = {"status": "ok", "matches": [], "cursor_start": cursor,
                                "cursor_end": cursor, "metadata": {}}
        return self._ask("complete", empty, source=code, cursor=cursor)

    async def inspect(self, code: str, cursor_pos: int, detail_level: int = 0,
                      omit_sections: Any = ()) -> InspectReply:
        empty: InspectReply = {"status": "ok", "found": False, "data": {}, "metadata": {}}
        return self._ask("inspect", empty, source=code, cursor=cursor_pos,
                         detail=1 if detail_level else 0)

    # history
    def _fresh_history(self) -> HistoryManager:
        if self._own_history is not None:
            self._own_history.close()
        self._own_history = HistoryManager(shell=self.shell, parent=self.shell,
                                           hist_file=":memory:")
        self.shell.history_manager = self._own_history
        return self._own_history

    def load_history(self) -> None:
        """The session's cells, from its versions (on opening it: a restarted kernel, a
        reopened notebook)."""
        try:
            cells = self.attachment.client.ask(History(self.attachment.session), CellHistory,
                                               ASK_TIMEOUT).cells
        except FabricError as exc:
            log.warning("llfabric: the session's history is not read: %s", exc.message)
            return
        self._fresh_history()
        for count, source in cells:
            self.record(count, source)

    def record(self, count: int, source: str) -> None:
        """A cell the session ran, as the kernel's history would have stored it."""
        manager = self._own_history
        if manager is None:
            return
        try:
            parsed = self.shell.transform_cell(source)
        except Exception:  # a cell that does not transform is kept as it was typed
            parsed = source
        latest = manager.get_tail(1, include_latest=True)
        # a cell run in the kernel itself (%%local) may have taken this line already
        line = max([count] + [row[1] + 1 for row in latest])
        manager.store_inputs(line, parsed, source)
        manager.writeout_cache()

    # comms
    def comm_seen(self, msg_type: str, content: dict, execution_count: int | None) -> None:
        """A comm message of the worker's, on its way to the frontend, while the cell of
        prompt `execution_count` runs (None: from a callback, between cells)."""
        comm_id = content.get("comm_id")
        if msg_type == "comm_open" and isinstance(comm_id, str):
            self._comms[comm_id] = execution_count
        elif msg_type == "comm_close" and isinstance(comm_id, str):
            self._comms.pop(comm_id, None)

    def close_comms(self) -> list[int]:
        """Close the worker's comms in the frontend (its widgets disappear), as after a checkout:
        no worker holds them any more, and they show the state before it. The prompts of the
        cells whose outputs showed them."""
        comms, self._comms = self._comms, {}
        for comm_id in comms:
            self.attachment.publish("comm_close", {"comm_id": comm_id, "data": {}})
        return sorted({count for count in comms.values() if count is not None})

    def _comm_handler(self, own: Any) -> Any:
        def handle(stream: Any, ident: Any, msg: dict) -> Any:
            comm_id = msg["content"].get("comm_id")
            if comm_id not in self._comms:
                return own(stream, ident, msg)  # one of the kernel's (the draft comm)
            kind = msg["header"]["msg_type"]
            if kind == "comm_close":
                self._comms.pop(comm_id, None)
            self._forward(kind, msg)
            return None

        return handle

    def _forward(self, kind: str, msg: dict) -> None:
        """The frontend's message to the worker's comm; its callbacks' outputs published."""
        try:
            sent = request("comm", session=self.attachment.session, msg_type=kind,
                           content=msg["content"],
                           buffers=[bytes(b) for b in msg.get("buffers") or []],
                           parent_id=msg["header"].get("msg_id"))
            for event in self.attachment.client.start(sent, timeout=COMM_TIMEOUT):
                if isinstance(event, Output | Comm):
                    self.attachment.publish_event(event)
                elif isinstance(event, Delivered) and not event.delivered:
                    log.warning("llfabric: the worker holding comm %s is gone or busy; the "
                                "frontend's message had no effect", msg["content"].get("comm_id"))
        except FabricError as exc:
            log.warning("llfabric: a comm message was not delivered: %s", exc.message)

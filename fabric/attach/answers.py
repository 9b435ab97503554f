"""The attached kernel's answers to a frontend's requests other than execute, from the session
rather than the kernel process, which holds none of its state.

Completion and inspection go to the server, which asks the session's live worker, or answers
from the catalog of its head when none is live (`snapshot.catalog`). History is the session's
cells, read from its versions when the session opens and kept up as cells run, in a history
manager of the kernel's own that no other kernel writes to: `history_request`, `%history` and
`%recall` (run in the kernel, see `relay.LOCAL`) see this session's cells and no other's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from IPython.core.history import HistoryManager

from ..errors import FabricError, RemoteError

if TYPE_CHECKING:
    from .relay import Attachment

log = logging.getLogger(__name__)

ASK_TIMEOUT = 5.0  # seconds a completion or inspection waits for the server


class Answers:
    """What one attachment answers; `install` takes the kernel's handlers, `uninstall` gives
    them back."""

    def __init__(self, attachment: Attachment) -> None:
        self.attachment = attachment
        self.shell = attachment.shell
        self.kernel = attachment.kernel
        self._own_history: HistoryManager | None = None
        self._kernel_history: HistoryManager | None = None

    def install(self) -> None:
        self.kernel.do_complete = self.complete
        self.kernel.do_inspect = self.inspect
        self._kernel_history = self.shell.history_manager
        self._fresh_history()

    def uninstall(self) -> None:
        for name in ("do_complete", "do_inspect"):
            self.kernel.__dict__.pop(name, None)
        if self._kernel_history is not None:
            self.shell.history_manager = self._kernel_history
            self._kernel_history = None
        if self._own_history is not None:
            self._own_history.close()
            self._own_history = None

    # completion and inspection
    def _ask(self, op: str, empty: dict, **fields: Any) -> dict:
        if not self.attachment.opened:
            return empty
        try:
            try:
                reply = self.attachment.call(op, timeout=ASK_TIMEOUT, **fields)
            except RemoteError as exc:
                if exc.kind != "unknown_session":
                    raise
                self.attachment.open()  # the server restarted: the session is in the store
                reply = self.attachment.call(op, timeout=ASK_TIMEOUT, **fields)
        except FabricError as exc:  # the frontend shows nothing, as for a name unknown
            log.info("llfabric: %s not answered: %s", op, exc.message)
            return empty
        return reply if reply.get("status") in ("ok", "error") else empty

    async def complete(self, code: str, cursor_pos: int | None) -> dict:
        cursor = len(code) if cursor_pos is None else cursor_pos
        empty = {"status": "ok", "matches": [], "cursor_start": cursor, "cursor_end": cursor,
                 "metadata": {}}
        return self._ask("complete", empty, source=code, cursor=cursor)

    async def inspect(self, code: str, cursor_pos: int, detail_level: int = 0,
                      omit_sections: Any = ()) -> dict:
        empty = {"status": "ok", "found": False, "data": {}, "metadata": {}}
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
            cells = self.attachment.call("history", timeout=ASK_TIMEOUT).get("cells")
        except FabricError as exc:
            log.warning("llfabric: the session's history is not read: %s", exc.message)
            return
        self._fresh_history()
        for cell in cells if isinstance(cells, list) else []:
            if isinstance(cell, list) and len(cell) == 2 and isinstance(cell[0], int) \
                    and isinstance(cell[1], str):
                self.record(cell[0], cell[1])

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

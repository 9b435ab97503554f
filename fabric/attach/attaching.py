"""The kernel's attachment, one at a time: `attach` routes its cells to a session of the fabric,
`detach` runs them in the kernel again, `current` is the attachment now.
"""

from __future__ import annotations

import atexit
import os
import sys
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import ExecutionResult, InteractiveShell

from .. import config as fabric_config
from ..errors import FabricError
from . import restart
from .notebook_file import find_notebook, frontend_name, session_name
from .relay import Attachment
from .routing import LOCAL, is_local

_attached: Attachment | None = None


def current(shell: InteractiveShell | None) -> Attachment | None:
    return _attached if _attached is not None and _attached.shell is shell else None


def attach(shell: InteractiveShell, address: str | None = None, session: str | None = None,
           notebook: str | None = None) -> Attachment:
    """Route the kernel's cells to `address` (default: the configured server), session `session`
    (default: `LLFABRIC_SESSION`, else named after the notebook or the kernel)."""
    global _attached
    require_kernel(shell)
    try:
        address = address or fabric_config.load().address
    except FabricError as exc:
        raise UsageError(exc.message) from exc
    path = Path(notebook).resolve() if notebook else find_notebook()
    session = session or _default_session(path, None if notebook else frontend_name())
    if _attached is not None:  # re-attaching: the old session closes unless it stays ours
        detach(shell, forget=_attached.session != session)
    attachment = Attachment(shell, address, session, path)
    _attached = attachment
    shell.run_cell = partial(_run_cell, attachment, type(shell).run_cell.__get__(shell))
    shell.should_run_async = lambda *args, **kwargs: False  # the relay blocks, as a sync cell
    attachment.answers.install()
    attachment.busy.install()
    attachment.debugging.install()
    _listen_for_drafts(attachment)
    restart.install(attachment)  # Restart Kernel empties the session
    atexit.register(attachment.close)  # a kernel shut down retires its session's workers
    try:
        reply = attachment.open()
    except FabricError as exc:
        print(f"llfabric: attached to {address}, but {exc.message}. Cells will fail until a "
              "server answers there (start one with `llfabric serve`).", file=sys.stderr)
        return attachment
    state = f"continuing at version {reply.version}" if reply.version else "a new session"
    print(f"llfabric: cells run on {address}, session {session} ({state})")
    return attachment


def require_kernel(shell: InteractiveShell) -> None:
    if getattr(shell, "kernel", None) is None:
        raise UsageError("llfabric attaches Jupyter kernels; this IPython has no kernel")


def detach(shell: InteractiveShell, forget: bool = True) -> bool:
    """Run cells in the kernel again; False if it was not attached."""
    global _attached
    attachment = current(shell)
    if attachment is None:
        return False
    _attached = None
    for name in ("run_cell", "should_run_async"):
        vars(shell).pop(name, None)
    attachment.frontend.close()
    restart.uninstall(attachment)
    atexit.unregister(attachment.close)
    attachment.answers.uninstall()
    attachment.busy.uninstall()
    attachment.debugging.uninstall()
    attachment.close(forget)
    return True


def _default_session(notebook: Path | None, name: str | None) -> str:
    if os.environ.get("LLFABRIC_SESSION"):
        return os.environ["LLFABRIC_SESSION"]
    try:
        from ipykernel.connect import get_connection_file

        fallback = Path(get_connection_file()).stem  # kernel-<id>: stays across restarts
    except (ImportError, RuntimeError, AttributeError):
        fallback = f"kernel-{uuid.uuid4().hex[:12]}"
    return session_name(notebook, fallback, name)


def _run_cell(attachment: Attachment, local_run_cell: Any, raw_cell: str, *args: Any,
              cell_id: str | None = None, **kwargs: Any) -> ExecutionResult:
    if is_local(raw_cell):
        match = LOCAL.match(raw_cell)
        if match is not None and match.group(1) == "%local":
            raw_cell = raw_cell.split("\n", 1)[1] if "\n" in raw_cell else ""
        try:
            return local_run_cell(raw_cell, *args, cell_id=cell_id, **kwargs)
        finally:
            attachment.frontend.update()  # `%llfabric checkout` moved the session, say
    return attachment.run(raw_cell, cell_id)


def _listen_for_drafts(attachment: Attachment) -> None:
    """Live edits and status for a frontend extension (`frontend`)."""
    attachment.frontend.install()

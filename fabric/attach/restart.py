"""Restart means what Jupyter users mean: a restart the user asks for (Restart Kernel, a
`shutdown_request` with `restart`) starts the session empty, as JupyterLab's dialog promises, with
prompt numbers from 1; the previous state stays in the session's history (`%llfabric checkout`).
A kernel that dies or is killed asks nothing: its replacement continues where the session was.
"""

from __future__ import annotations

import logging
from typing import Any

from ..client import Client
from ..errors import FabricError
from .attached import Attached

log = logging.getLogger(__name__)

TIMEOUT = 3.0  # a restart waits no longer than this for the server


def install(attachment: Attached) -> None:
    kernel = attachment.kernel
    shut_down = type(kernel).do_shutdown.__get__(kernel)

    def do_shutdown(restart: bool) -> Any:
        if restart:
            empty(attachment)
        return shut_down(restart)

    kernel.do_shutdown = do_shutdown


def uninstall(attachment: Attached) -> None:
    attachment.kernel.__dict__.pop("do_shutdown", None)


def empty(attachment: Attached) -> None:
    """Make the session's next version the empty state (version 0's). On the control thread:
    a client of its own, as the kernel's may be in use by a cell."""
    if not attachment.opened:
        return
    try:
        with Client(attachment.address, timeout=TIMEOUT) as client:
            client.checkout(attachment.session, 0)
    except FabricError as exc:  # a running cell, a server down: the session keeps its state
        getattr(attachment.kernel, "log", log).warning(
            "llfabric: session %s: restarted, but the session keeps its state: %s",
            attachment.session, exc.message)

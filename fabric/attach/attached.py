"""What the parts of an attachment (its answers, frontend comms, debugger and restart) use of the
attachment that holds them: the kernel, the session, and the ways to the server and to the
frontend. `relay.Attachment` is one; the parts name this rather than it, so that they sit below
the relay that makes them.
"""

from __future__ import annotations

from typing import Any, Protocol

from IPython.core.interactiveshell import InteractiveShell

from ..client import Client
from ..messages import Comm, Output
from ..status import SessionStatus


class Attached(Protocol):
    shell: InteractiveShell
    kernel: Any  # an ipykernel kernel
    address: str
    session: str
    client: Client  # the one the running cell uses: only on the kernel's main thread
    opened: bool  # the session was opened: the server knows it

    def open(self) -> SessionStatus:
        """Open (or rejoin) the session, as after a server restart."""
        ...

    def publish(self, msg_type: str, content: dict, metadata: dict | None = None,
                buffers: list[bytes] | None = None) -> None:
        """Send on IOPub, as the kernel does."""
        ...

    def publish_event(self, event: Output | Comm) -> None:
        """An output or a comm message of the session's worker, as the kernel's own."""
        ...

    def checked_out(self) -> str | None:
        """After a checkout: what to tell the user of the widgets it closed, if any."""
        ...

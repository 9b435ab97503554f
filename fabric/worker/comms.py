"""Comms opened in a worker (ipywidgets, `tqdm.notebook` bars) reach the frontend: what a
kernel would publish on its IOPub channel for a comm goes to the server as `CommOut` messages,
which the attached kernel publishes as its own. Messages the frontend sends back are not
relayed yet, and `tqdm.auto` draws text: it looks for `ipykernel.zmqshell`, which a worker does
not import (half a second on every cold worker).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import comm
from comm.base_comm import BaseComm

from .messages import CommOut

Send = Callable[[CommOut], None]


def install(send: Send) -> None:
    """Comms created from now on publish through `send`."""
    class WorkerComm(BaseComm):
        def publish_msg(self, msg_type: str, data: dict | None = None,
                        metadata: dict | None = None, buffers: list | None = None,
                        **keys: Any) -> None:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()  # what the cell printed before comes first
            send(CommOut(msg_type, {"comm_id": self.comm_id, "data": data or {}, **keys},
                         metadata or {}, [bytes(b) for b in buffers or []]))

    comm.create_comm = WorkerComm

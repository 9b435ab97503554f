"""Comms opened in a worker (ipywidgets, `tqdm.notebook` bars) reach the frontend: what a
kernel would publish on its IOPub channel for a comm goes to the server as `CommOut` messages,
which the attached kernel publishes as its own; what the frontend sends back to one between
cells (a slider moved) is handled by `receive`, its callbacks' outputs relayed the same way.
`tqdm.auto` draws text: it looks for `ipykernel.zmqshell`, which a worker does
not import (half a second on every cold worker).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import comm
from comm.base_comm import BaseComm

from ..protocol import Wire
from .messages import CommIn, CommOut

Send = Callable[[CommOut], None]


def install(send: Send, shell: Any) -> None:
    """Comms created from now on publish through `send`."""
    class WorkerComm(BaseComm):
        # what a comm's kernel is asked for, the shell answers: the frontend's request being
        # handled (`get_parent`), under which an output widget captures outputs
        kernel = shell

        def publish_msg(self, msg_type: str, data: dict | None = None,
                        metadata: dict | None = None, buffers: list | None = None,
                        **keys: Any) -> None:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()  # what the cell printed before comes first
            send(CommOut(msg_type, {"comm_id": self.comm_id, "data": data or {}, **keys},
                         metadata or {}, [bytes(b) for b in buffers or []]))

    comm.create_comm = WorkerComm


def receive(message: CommIn) -> Wire:
    """Hand a frontend's comm message to its comm, as a kernel's comm manager does; the
    content of the answer (an error if the comm is unknown or its callback raised)."""
    manager = comm.get_comm_manager()
    comm_id = message.content.get("comm_id")
    target = manager.get_comm(comm_id) if isinstance(comm_id, str) else None
    if target is None:
        return {"status": "error", "ename": "KeyError", "evalue": f"no comm {comm_id!r}"}
    msg = {"content": message.content, "buffers": message.buffers, "metadata": {},
           "header": {"msg_type": message.msg_type}}
    try:
        if message.msg_type == "comm_close":
            # comm's annotations ask for the kernel's stream and identity, which it never uses
            manager.comm_close(None, None, msg)  # pyright: ignore[reportArgumentType]
        else:
            target.handle_msg(msg)
    except Exception as exc:  # the callback's error: the frontend's message had no effect
        return {"status": "error", "ename": type(exc).__name__, "evalue": str(exc)}
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # what the callbacks printed goes before the answer
    return {"status": "ok"}

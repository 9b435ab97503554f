"""The kernel reads busy while a cell runs, as a plain kernel's does.

Requests handled beside the running cell (a frontend extension's comm messages on a kernel
subshell, the subshell's creation on the control channel) end with an `idle` status of their
own, and JupyterLab shows a kernel's latest status whatever request it is about: the kernel read
Idle while the cell ran. After such an idle, the kernel says `busy` again for the cell's request.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class Busy:
    """The execute request the kernel's main shell runs, and the kernel's status publisher that
    keeps saying so."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self._request: dict | None = None
        self._lock = threading.Lock()  # a busy said after the cell's idle would stay

    def install(self) -> None:
        kernel = self.kernel
        publish = type(kernel)._publish_status.__get__(kernel)

        def publish_status(status: str, channel: str, parent: dict | None = None) -> None:
            publish(status, channel, parent)
            if status != "idle":
                return
            about = ((parent or kernel.get_parent(channel) or {}).get("header") or {}).get("msg_id")
            with self._lock:
                request = self._request
                if request is not None and request["header"].get("msg_id") != about:
                    publish("busy", "shell", request)

        kernel._publish_status = publish_status

    def uninstall(self) -> None:
        self.kernel.__dict__.pop("_publish_status", None)

    @contextlib.contextmanager
    def running(self, request: dict | None) -> Iterator[None]:
        """While the cell of execute request `request` (a message with its header) runs."""
        with self._lock:
            self._request = request if request and request.get("header") else None
        try:
            yield
        finally:
            with self._lock:
                self._request = None

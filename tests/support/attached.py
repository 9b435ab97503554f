"""Attached kernels for tests: the llfabric kernelspec, started and driven by jupyter_client."""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from jupyter_client import BlockingKernelClient, KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from fabric.attach.kernels import install_kernelspec

REPO = Path(__file__).resolve().parents[2]
KERNEL_NAME = "llfabric-test"


def install_test_kernelspec(prefix: Path) -> KernelSpecManager:
    """The llfabric kernelspec under `prefix`, and a spec manager that finds it."""
    install_kernelspec(KERNEL_NAME, prefix=str(prefix))
    return KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])


def kernel_env(address: str, session: str, base: dict[str, str] | None = None,
               **more: str) -> dict[str, str]:
    """The kernel's environment (`base`, else ours) with this checkout first on the path, the
    server and the session."""
    base = dict(os.environ) if base is None else base
    path = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH")) if p)
    return {**base, "PYTHONPATH": path, "LLFABRIC_BIND": address, "LLFABRIC_SESSION": session,
            **more}


class Kernel:
    """A kernel and a blocking client on its channels, as a notebook frontend holds them."""

    def __init__(self, manager: KernelManager) -> None:
        self.manager = manager
        self.client: BlockingKernelClient = manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    @classmethod
    def start(cls, specs: KernelSpecManager, env: dict[str, str], cwd: Path,
              kernel_name: str = KERNEL_NAME, log: Path | None = None) -> Kernel:
        """Start a kernel; with `log`, its stderr (the kernel's log) goes to that file. Its
        channels are Unix sockets of its own: TCP ports chosen free by the client can be taken
        by another process before the kernel binds them, on a busy machine."""
        sockets = tempfile.mkdtemp(prefix="llfk-")
        manager = KernelManager(kernel_name=kernel_name, kernel_spec_manager=specs,
                                transport="ipc", ip=os.path.join(sockets, "k"))
        if log is None:
            manager.start_kernel(env=env, cwd=str(cwd))
        else:
            with open(log, "wb") as stderr:
                manager.start_kernel(env=env, cwd=str(cwd), stderr=stderr)
        return cls(manager)

    def restart(self) -> None:
        self.client.stop_channels()
        self.manager.restart_kernel(now=True)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def stop(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        shutil.rmtree(os.path.dirname(self.manager.ip), ignore_errors=True)

    def execute(self, code: str, *, cell_id: str | None = None,
                answer: Callable[[dict], str] | None = None,
                on_output: Callable[[dict], None] | None = None,
                timeout: float = 120.0) -> tuple[dict, list[dict]]:
        """Run a cell; return its execute_reply content and its IOPub messages (no status or
        execute_input). `answer` answers input requests; `on_output` sees each message."""
        client = self.client
        message = client.session.msg("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": answer is not None, "stop_on_error": True})
        if cell_id is not None:
            message["metadata"]["cellId"] = cell_id
        client.shell_channel.send(message)
        msg_id = message["header"]["msg_id"]
        outputs: list[dict] = []
        reply, idle = None, False
        deadline = time.monotonic() + timeout
        while reply is None or not idle:
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell did not finish in {timeout} s: {code!r}")
            if answer is not None:
                try:
                    request = client.get_stdin_msg(timeout=0.01)
                    client.input(answer(request["content"]))
                except queue.Empty:
                    pass
            try:
                msg = client.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                msg = None
            if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                kind = msg["msg_type"]
                if kind == "status":
                    idle = msg["content"]["execution_state"] == "idle"
                elif kind != "execute_input":
                    outputs.append(msg)
                    if on_output is not None:
                        on_output(msg)
            if reply is None:
                try:
                    shell = client.get_shell_msg(timeout=0.01)
                    if shell["parent_header"].get("msg_id") == msg_id:
                        reply = shell["content"]
                except queue.Empty:
                    pass
        return reply, outputs


def text_of(outputs: list[dict], name: str = "stdout") -> str:
    return "".join(m["content"]["text"] for m in outputs
                   if m["msg_type"] == "stream" and m["content"]["name"] == name)

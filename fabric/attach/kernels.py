"""Jupyter-side set-up: attach a kernel that already runs, install the llfabric kernelspec."""

from __future__ import annotations

import ast
import json
import queue
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NotRequired, TypedDict

from ..errors import KernelError

DISPLAY_NAME = "Python 3 (llfabric)"
LOGO = Path(__file__).with_name("logo-svg.svg")  # the launcher's icon for the kernel
CURRENT = "__import__('fabric.attach', fromlist=['current']).current(get_ipython())"
ENV_VARIABLE = "LLFABRIC_SESSION_ENV"  # the environment a kernel's session opens in


class KernelSpec(TypedDict):
    """A Jupyter kernelspec, as its kernel.json holds it."""

    argv: list[str]
    display_name: str
    language: str
    metadata: dict[str, bool]
    env: NotRequired[dict[str, str]]


def kernelspec(address: str | None = None, env: str | None = None) -> KernelSpec:
    """A python3 kernel that loads `fabric.attach` at start, so every cell runs on the fabric;
    with `env`, its session imports from that environment of the user's."""
    spec: KernelSpec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--ext=fabric.attach"],
        "display_name": DISPLAY_NAME if env is None else f"{DISPLAY_NAME[:-1]}, {env})",
        "language": "python",
        "metadata": {"debugger": True},  # JupyterLab's debugger, on the session's workers
    }
    settings = {"LLFABRIC_BIND": address, ENV_VARIABLE: env}
    if any(settings.values()):
        spec["env"] = {k: v for k, v in settings.items() if v}
    return spec


def install_kernelspec(name: str = "llfabric", address: str | None = None, user: bool = True,
                       prefix: str | None = None, env: str | None = None) -> str:
    """Install the kernelspec; return the directory it was installed in."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(kernelspec(address, env), indent=1))
        shutil.copy(LOGO, Path(tmp) / LOGO.name)
        return KernelSpecManager().install_kernel_spec(tmp, name, user=user and not prefix,
                                                       prefix=prefix)


def attach_running(kernel: str, address: str, session: str | None = None,
                   timeout: float = 30.0) -> str:
    """Attach the kernel with connection file (or id) `kernel`; return the session name."""
    from jupyter_client import find_connection_file
    from jupyter_client.blocking.client import BlockingKernelClient

    path = kernel if Path(kernel).is_file() else None
    if path is None:
        try:
            path = find_connection_file(kernel)
        except OSError as exc:
            raise KernelError(f"no running kernel {kernel!r}: {exc}", kernel=kernel) from exc
    code = f"%load_ext fabric.attach.magics\n%llfabric attach {shlex.quote(address)}"
    if session:
        code += f" --session {shlex.quote(session)}"
    client = BlockingKernelClient()
    client.load_connection_file(path)
    client.start_channels()
    try:
        client.wait_for_ready(timeout=timeout)
        msg_id = client.execute(code, silent=True, user_expressions={"session": CURRENT +
                                                                      ".session"})
        while True:
            reply = client.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
    except (RuntimeError, queue.Empty) as exc:
        raise KernelError(f"the kernel at {path} did not answer: {exc}", kernel=kernel) from exc
    finally:
        client.stop_channels()
    content = reply["content"]
    result = content.get("user_expressions", {}).get("session", {})
    if content.get("status") != "ok" or result.get("status") != "ok":
        why = content.get("evalue") or result.get("evalue") or "unknown error"
        raise KernelError(f"the kernel could not attach: {why}", kernel=kernel)
    return ast.literal_eval(result["data"]["text/plain"])

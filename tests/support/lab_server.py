"""A real JupyterLab for browser tests and benchmarks: the built extension (labextension/dist),
the llfabric test kernel, and Jupyter directories of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from attached import REPO, install_test_kernelspec

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BUILT = REPO / "labextension" / "dist"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyterlab(root: Path, address: str, session: str) -> Iterator[str]:
    """A JupyterLab serving `root` with the built extension and the llfabric test kernel, in
    directories of its own; its URL."""
    home = root / "jupyter"
    install_test_kernelspec(home)
    extensions = home / "extensions"
    extensions.mkdir()
    (extensions / "llfabric-lab").symlink_to(BUILT)
    # no "get notified about Jupyter news?" toast over what a test looks at (the host is offline)
    news = home / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}')
    port = _free_port()
    env = {**os.environ, "JUPYTER_PATH": str(home / "share" / "jupyter"),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p),
           "LLFABRIC_BIND": address, "LLFABRIC_SESSION": session}
    log = open(root / "jupyterlab.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password=",
         "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={root}",
         f"--LabApp.extra_labextensions_path={extensions}",
         f"--LabApp.user_settings_dir={home / 'settings'}",
         f"--LabApp.workspaces_dir={home / 'workspaces'}"],
        env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise AssertionError("JupyterLab did not start: " +
                                         (root / "jupyterlab.log").read_text()[-2000:]) from None
                time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()

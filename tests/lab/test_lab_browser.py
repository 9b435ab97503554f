"""The JupyterLab extension (labextension/) in a real browser: Chromium driven by Playwright, a
real JupyterLab, the llfabric kernel and a real `llfabric serve`. A failing test leaves a
screenshot in its tmp dir."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from attached import KERNEL_NAME, REPO, install_test_kernelspec
from helpers import RunningServer, serving

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BUILT = REPO / "labextension" / "dist"
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (make sysdeps installs it)", allow_module_level=True)
if not (BUILT / "package.json").is_file():
    pytest.skip("the extension is not built (make labextension)", allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # no worker kept after a cell: a prepared worker shows that a draft arrived
    with serving(tmp_path_factory.mktemp("store"), keep_warm=0) as running:
        yield running


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _jupyterlab(root: Path, server: RunningServer, session: str) -> Iterator[str]:
    """A JupyterLab serving `root` with the built extension and the llfabric test kernel, in
    directories of its own; its URL."""
    home = root / "jupyter"
    install_test_kernelspec(home)
    extensions = home / "extensions"
    extensions.mkdir()
    (extensions / "llfabric-lab").symlink_to(BUILT)
    port = _free_port()
    env = {**os.environ, "JUPYTER_PATH": str(home / "share" / "jupyter"),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p),
           "LLFABRIC_BIND": server.address, "LLFABRIC_SESSION": session}
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


def _session_status(server: RunningServer, session: str) -> dict | None:
    with server.client() as client:
        status = client.call("status")
    return next((s for s in status["sessions"] if s["session"] == session), None)


def _wait_until(check, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


@pytest.fixture
def page(tmp_path: Path) -> Iterator:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            yield page
        finally:
            browser.close()


def test_typing_drafts_and_the_status_item_shows_the_session(server: RunningServer, page,
                                                             tmp_path: Path,
                                                             request: pytest.FixtureRequest
                                                             ) -> None:
    session = f"lab-{uuid.uuid4().hex[:8]}"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_NAME,
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("x = 41"), nbformat.v4.new_code_cell("")]
    nbformat.write(nb, str(tmp_path / "work.ipynb"))
    with _jupyterlab(tmp_path, server, session) as url:
        try:
            page.goto(f"{url}/lab/tree/work.ipynb")
            item = page.locator("[data-llfabric=status]")
            # the kernel attached and the extension hears its status comm
            item.filter(has_text=session).wait_for(timeout=90_000)
            assert "cold" in item.inner_text()  # a new session: no worker yet
            first = page.locator(".jp-Notebook .jp-Cell").nth(0)
            first.locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")  # runs `x = 41`, moves to the empty cell
            assert _wait_until(lambda: (_session_status(server, session) or {})
                               .get("version") == 1)
            assert not _session_status(server, session)["prepared"]  # retired after the cell
            second = page.locator(".jp-Notebook .jp-Cell").nth(1)
            second.locator(".cm-content").click()
            page.keyboard.type("x + 1", delay=80)  # unsaved: only a live draft can tell it
            assert _wait_until(lambda: _session_status(server, session)["prepared"]), \
                "the server got no draft of the cell being typed"
            page.keyboard.press("Shift+Enter")
            second.locator(".jp-OutputArea-output").filter(has_text="42") \
                .wait_for(timeout=60_000)
            assert session in item.inner_text()
            page.screenshot(path=str(tmp_path / "lab.png"))  # what a user sees, for the record
        except BaseException:
            page.screenshot(path=str(tmp_path / "failure.png"))
            (tmp_path / "failure.json").write_text(json.dumps(
                {"test": request.node.name, "status": _session_status(server, session)}))
            raise

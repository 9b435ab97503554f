"""The JupyterLab extension (labextension/) in a real browser: Chromium driven by Playwright, a
real JupyterLab, the llfabric kernel and a real `llfabric serve`. A failing test leaves a
screenshot in its tmp dir."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from attached import KERNEL_NAME
from helpers import RunningServer, serving
from lab_server import BUILT, CHROMIUM, jupyterlab

pytestmark = pytest.mark.browser

WAITING = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)"  # for `go`

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


def _session_status(server: RunningServer, session: str) -> dict | None:
    with server.client() as client:
        status = client.status()
    return next((s.to_map() for s in status.sessions if s.session == session), None)


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


@dataclass
class Lab:
    """A notebook open in JupyterLab on the llfabric kernel: its session, the server's URL and
    the browser page showing it (a test that closes the tab puts the new one here)."""
    session: str
    url: str
    page: Any


@contextlib.contextmanager
def _notebook(server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest,
              *sources: str) -> Iterator[Lab]:
    """A new notebook of `sources` in tmp_path, open once the status item names its session.
    A failure leaves a screenshot and the session's status in tmp_path; a cell waiting for the
    file `go` is let go in the end."""
    session = f"lab-{uuid.uuid4().hex[:8]}"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_NAME,
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(nb, str(tmp_path / "work.ipynb"))
    with jupyterlab(tmp_path, server.address, session) as url:
        lab = Lab(session, url, page)
        try:
            page.goto(f"{url}/lab/tree/work.ipynb")
            page.locator("[data-llfabric=status]").filter(has_text=session) \
                .wait_for(timeout=90_000)
            yield lab
        except BaseException:
            lab.page.screenshot(path=str(tmp_path / "failure.png"))
            (tmp_path / "failure.json").write_text(json.dumps(
                {"test": request.node.name, "status": _session_status(server, session)}))
            raise
        finally:
            (tmp_path / "go").touch()


def test_typing_drafts_and_the_status_item_shows_the_session(server: RunningServer, page,
                                                             tmp_path: Path,
                                                             request: pytest.FixtureRequest
                                                             ) -> None:
    with _notebook(server, page, tmp_path, request, "x = 41", "") as lab:
        session = lab.session
        item = page.locator("[data-llfabric=status]")
        # the kernel attached and the extension hears its status comm
        item.filter(has_text=session).wait_for(timeout=90_000)
        assert "cold" in item.inner_text()  # a new session: no worker yet
        assert "saved" not in item.inner_text()  # nor savings to speak of
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
        item.filter(has_text="saved").wait_for(timeout=30_000)  # the lease is counted now
        page.screenshot(path=str(tmp_path / "lab.png"))  # what a user sees, for the record
        # the notebook's metadata names its session, which a kernel started for it opens
        page.keyboard.press("Control+s")
        assert _wait_until(lambda: json.loads((tmp_path / "work.ipynb").read_text())
                           ["metadata"].get("llfabric") == {"session": session,
                                                           "path": "work.ipynb"})
    # the extension closed its comms where the kernel had them (a close sent to a subshell
    # already deleted is refused, in the kernel's log)
    assert "Unknown subshell_id" not in (tmp_path / "jupyterlab.log").read_text()


def test_a_checkout_from_the_history_panel_changes_what_the_next_cell_sees(
        server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _notebook(server, page, tmp_path, request,
                   "x = 1", "x = 2\ny = x * 10", "z = x\nprint('x is', x)") as lab:
        session = lab.session
        cells = page.locator(".jp-Notebook .jp-Cell")
        for at in (0, 1):  # versions 1 and 2
            cells.nth(at).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            assert _wait_until(lambda at=at: (_session_status(server, session) or {})
                               .get("version") == at + 1)
        page.locator(".jp-SideBar [data-id=llfabric-history]").click()  # the panel's tab
        panel = page.locator("[data-llfabric=history]")
        panel.filter(has_text=f"session {session} · version 2").wait_for(timeout=30_000)
        latest = panel.locator("[data-version='2']")
        assert "[2] x = 2 …" in latest.inner_text()
        assert "+y ~x" in latest.inner_text()  # what the cell changed
        first = panel.locator("[data-version='1']")
        assert "[1] x = 1" in first.inner_text() and "+x" in first.inner_text()
        first.click()  # as `%llfabric checkout 1`
        assert _wait_until(lambda: _session_status(server, session)["version"] == 3)
        panel.locator("[data-version='3']").filter(has_text="checkout of version 1") \
            .wait_for(timeout=30_000)
        page.screenshot(path=str(tmp_path / "history.png"))  # for the record
        cells.nth(2).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        cells.nth(2).locator(".jp-OutputArea-output").filter(has_text="x is 1") \
            .wait_for(timeout=60_000)
        # the cell after the checkout is in the list, refreshed without asking
        panel.locator("[data-version='4']").filter(has_text="z = x") \
            .wait_for(timeout=30_000)


def test_a_checkout_closes_the_widgets_of_the_state_before_it(
        server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _notebook(server, page, tmp_path, request,
                   "import ipywidgets as w\ns = w.IntSlider()\ns", "y = 1") as lab:
        cells = page.locator(".jp-Notebook .jp-Cell")
        slider = cells.nth(0).locator(".widget-slider")
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")  # version 1
        slider.wait_for(timeout=60_000)
        page.keyboard.press("Shift+Enter")  # version 2
        assert _wait_until(lambda: (_session_status(server, lab.session) or {})
                           .get("version") == 2)
        page.locator(".jp-SideBar [data-id=llfabric-history]").click()
        page.locator("[data-llfabric=history] [data-version='1']").click()
        # no slider left showing a value the session does not have, and the user is told
        page.locator(".Toastify__toast").filter(
            has_text="the widgets shown by cell [1] held the values from before the checkout") \
            .wait_for(timeout=30_000)
        slider.wait_for(state="detached", timeout=10_000)


def test_typing_while_a_cell_runs_drafts_on_a_subshell(server: RunningServer, page,
                                                       tmp_path: Path,
                                                       request: pytest.FixtureRequest) -> None:
    with _notebook(server, page, tmp_path, request, "x = 41", WAITING, "") as lab:
        session = lab.session
        cells = page.locator(".jp-Notebook .jp-Cell")
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")  # x = 41
        assert _wait_until(lambda: (_session_status(server, session) or {})
                           .get("version") == 1)
        page.keyboard.press("Shift+Enter")  # the waiting cell; the focus moves on
        assert _wait_until(lambda: _session_status(server, session)["running"])
        assert not _session_status(server, session)["prepared"]
        cells.nth(2).locator(".cm-content").click()
        page.keyboard.type("x + 1", delay=80)  # while the kernel's main shell waits
        assert _wait_until(lambda: _session_status(server, session)["prepared"], 30), \
            "no draft reached the server while the cell ran"
        assert _session_status(server, session)["running"]
        (tmp_path / "go").touch()
        page.keyboard.press("Shift+Enter")
        cells.nth(2).locator(".jp-OutputArea-output").filter(has_text="42") \
            .wait_for(timeout=60_000)


@pytest.mark.parametrize("leave", ["close", "reload"])
def test_a_cell_keeps_running_across_a_closed_tab_and_its_outputs_come_back(
        server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest,
        leave: str) -> None:
    # a line every 0.3 s, and a display updated with it; from line 12 on once the test says
    # so, after the notebook is back
    lines = ("import os, time\nshown = display('progress -', display_id=True)\n"
             "for i in range(20):\n    if i == 12:\n"
             "        while not os.path.exists('go'):\n            time.sleep(0.05)\n"
             "    print('line', i, flush=True)\n    shown.update(f'progress {i}')\n"
             "    time.sleep(0.3)")
    with _notebook(server, page, tmp_path, request, "x = 1", lines) as lab:
        session = lab.session
        cells = page.locator(".jp-Notebook .jp-Cell")
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")  # [1]
        assert _wait_until(lambda: (_session_status(server, session) or {})
                           .get("version") == 1)
        page.keyboard.press("Shift+Enter")  # the printing cell, [2]
        cells.nth(1).locator(".jp-OutputArea-output").filter(has_text="line 2") \
            .wait_for(timeout=60_000)
        if leave == "close":  # the tab goes; the kernel and its cell run on, lines too
            browser = page.context.browser
            page.close()
            time.sleep(1.5)
            page = lab.page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{lab.url}/lab/tree/work.ipynb")
        else:
            page.reload()
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        # the outputs so far, lines printed while no tab was open among them, and [*]
        cell.locator(".jp-OutputArea-output").filter(has_text="line 11") \
            .wait_for(timeout=90_000)
        cell.locator(".jp-InputPrompt").filter(has_text="[*]").wait_for(timeout=10_000)
        # the status item is back while the cell runs, not only once it ends
        page.locator("[data-llfabric=status]").filter(has_text=session) \
            .wait_for(timeout=30_000)
        assert _session_status(server, session)["running"]
        (tmp_path / "go").touch()
        # the later lines as they come, then the cell's end with its count
        cell.locator(".jp-OutputArea-output").filter(has_text="line 19") \
            .wait_for(timeout=60_000)
        cell.locator(".jp-InputPrompt").filter(has_text="[2]").wait_for(timeout=30_000)
        shown = cell.locator(".jp-OutputArea").inner_text()
        assert [line for line in shown.splitlines() if line.startswith("line")] == \
            [f"line {i}" for i in range(20)]
        assert [line for line in shown.splitlines() if "progress" in line] == \
            ["'progress 19'"]  # the display, updated in place


def test_cells_run_since_the_last_save_come_back_after_a_reload(
        server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    waiting = "import os, time; w = [time.sleep(0.05) for _ in iter(lambda: os.path.exists(" \
              "'go'), True)]; print('went')"
    with _notebook(server, page, tmp_path, request, "x = 1", "y = 2") as lab:
        cells = page.locator(".jp-Notebook .jp-Cell")
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")  # [1], in the file
        cells.nth(0).locator(".jp-InputPrompt").filter(has_text="[1]").wait_for(timeout=60_000)
        for source in ("print('unsaved', x + 1)", waiting):  # new cells above `y = 2`
            page.keyboard.press("Escape")
            page.keyboard.press("a")
            page.keyboard.press("Enter")
            page.keyboard.type(source)
            page.keyboard.press("Shift+Enter")  # [2], then [3], which waits
        cells.nth(1).locator(".jp-OutputArea-output").filter(has_text="unsaved 2") \
            .wait_for(timeout=60_000)
        assert _wait_until(lambda: _session_status(server, lab.session)["running"])
        page.reload()
        page.locator("[data-llfabric=status]").filter(has_text=lab.session) \
            .wait_for(timeout=90_000)
        # back where they were, with their sources and outputs; the file's cells as they ran
        cells.nth(1).locator(".jp-OutputArea-output").filter(has_text="unsaved 2") \
            .wait_for(timeout=30_000)
        assert "print('unsaved', x + 1)" in cells.nth(1).locator(".cm-content").inner_text()
        cells.nth(2).locator(".jp-InputPrompt").filter(has_text="[*]").wait_for(timeout=10_000)
        (tmp_path / "go").touch()
        cells.nth(2).locator(".jp-OutputArea-output").filter(has_text="went") \
            .wait_for(timeout=30_000)
        cells.nth(2).locator(".jp-InputPrompt").filter(has_text="[3]").wait_for(timeout=10_000)
        assert [cells.nth(at).locator(".jp-InputPrompt").inner_text().strip()
                for at in range(4)] == ["[1]:", "[2]:", "[3]:", "[ ]:"]
        toasts = page.locator(".Toastify__toast").filter(has_text="llfabric")
        toasts.filter(has_text="cells [2], [3], run since the notebook was last saved, were "
                               "not in its file").wait_for(timeout=10_000)
        assert toasts.count() == 1, toasts.all_inner_texts()  # [1] is in it: nothing to say


def test_the_status_item_follows_the_lease_and_counts_restart_at_one_after_a_restart(
        server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _notebook(server, page, tmp_path, request,
                   "x = 1", "%llfabric status", WAITING, "print('x' in dir())") as lab:
        session = lab.session
        item = page.locator("[data-llfabric=status]")
        item.filter(has_text=session).wait_for(timeout=90_000)
        # no worker yet, nor savings to speak of
        assert item.inner_text().endswith("· cold · lease released")
        cells = page.locator(".jp-Notebook .jp-Cell")
        prompts = [cells.nth(at).locator(".jp-InputPrompt") for at in range(4)]
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")  # x = 1
        prompts[0].filter(has_text="[1]").wait_for(timeout=60_000)
        page.keyboard.press("Shift+Enter")  # %llfabric status: a cell like any other
        cells.nth(1).locator(".jp-OutputArea-output").filter(has_text=session) \
            .wait_for(timeout=60_000)
        prompts[1].filter(has_text="[2]").wait_for(timeout=30_000)
        page.keyboard.press("Shift+Enter")  # the waiting cell: a worker, the lease held
        item.filter(has_text="· hot · lease held ·").wait_for(timeout=30_000)
        assert _session_status(server, session)["running"]
        (tmp_path / "go").touch()
        prompts[2].filter(has_text="[3]").wait_for(timeout=60_000)
        assert [prompt.inner_text().strip() for prompt in prompts[:3]] == \
            ["[1]:", "[2]:", "[3]:"]

        def released_at_the_servers_tier() -> bool:
            tier = _session_status(server, session)["tier"]
            return tier in ("warm", "cool", "cold") and \
                f"· {tier} · lease released ·" in item.inner_text()
        assert _wait_until(released_at_the_servers_tier, 30), item.inner_text()
        before = _session_status(server, session)["version"]
        # Kernel > Restart Kernel…, and yes in JupyterLab's dialog: an empty session
        page.locator(".lm-MenuBar-itemLabel").filter(has_text="Kernel").click()
        page.locator(".lm-Menu-itemLabel").filter(has_text="Restart Kernel…").first.click()
        page.locator(".jp-Dialog-button").filter(has_text="Restart").click()
        # the kernel empties the session (a checkout of version 0) before it goes; the
        # session is closed on the server until the new kernel attaches again
        assert _wait_until(lambda: (_session_status(server, session) or {})
                           .get("version", before) > before)
        item.filter(has_text=session).wait_for(timeout=60_000)
        cells.nth(3).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        cells.nth(3).locator(".jp-OutputArea-output").filter(has_text="False") \
            .wait_for(timeout=60_000)
        prompts[3].filter(has_text="[1]").wait_for(timeout=30_000)
        assert prompts[3].inner_text().strip() == "[1]:"


def test_a_notice_comes_once_per_condition_and_not_again_after_a_reload(
        server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _notebook(server, page, tmp_path, request, "g = (i for i in range(3))",
                   "h = (i for i in range(3))") as lab:
        toasts = page.locator(".Toastify__toast").filter(has_text="llfabric")
        page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")  # g cannot be saved: the session is pinned
        toasts.filter(has_text="pinned").wait_for(timeout=60_000)
        page.keyboard.press("Shift+Enter")  # h: the same condition again
        item = page.locator("[data-llfabric=status]")  # its tooltip: the details
        assert _wait_until(lambda: "h cannot be saved" in (item.get_attribute("title") or ""))
        assert toasts.count() == 1, toasts.all_inner_texts()  # the one notice
        assert "del them" in toasts.first.inner_text()  # what the user can do
        page.reload()
        item.filter(has_text=lab.session).filter(has_text="pinned").wait_for(timeout=90_000)
        assert toasts.count() == 0, toasts.all_inner_texts()  # not replayed


def test_a_cell_that_runs_and_prints_is_not_drafted_again(
        server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    printing = "import time\nfor i in range(40):\n    print('at', i, flush=True)\n" \
               "    time.sleep(0.1)"
    with _notebook(server, page, tmp_path, request, printing) as lab:
        cell = page.locator(".jp-Notebook .jp-Cell").nth(0)
        cell.locator(".cm-content").click()
        page.keyboard.press("Control+Enter")  # runs it and stays on it: its outputs change
        cell.locator(".jp-OutputArea-output").filter(has_text="at 20").wait_for(timeout=60_000)
        status = _session_status(server, lab.session)
        assert status["running"] and not status["prepared"], status  # nothing typed


def _run_each(page, cells, count: int) -> None:
    """Run the first `count` cells in turn, each once the one before has its prompt number."""
    cells.nth(0).locator(".cm-content").click()
    for at in range(count):
        page.keyboard.press("Shift+Enter")
        cells.nth(at).locator(".jp-InputPrompt").filter(has_text=f"[{at + 1}]") \
            .wait_for(timeout=60_000)


def test_history_rows_are_the_cells_that_changed_state_by_their_prompts_and_times(
        server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    sources = ["x = 1", "x", "%%local\n1 + 1", "print(x)", "x = 2", "x = 3"]
    with _notebook(server, page, tmp_path, request, *sources) as lab:
        cells = page.locator(".jp-Notebook .jp-Cell")
        _run_each(page, cells, len(sources))
        # a version each for the three cells that changed `x`; none for those that read it
        assert _session_status(server, lab.session)["version"] == 3
        page.locator(".jp-SideBar [data-id=llfabric-history]").click()
        panel = page.locator("[data-llfabric=history]")
        panel.filter(has_text=f"session {lab.session} · version 3").wait_for(timeout=30_000)
        rows = panel.locator(".llfabric-History-source")
        # newest first, each by the prompt its cell shows in the notebook
        assert rows.all_inner_texts() == ["[6] x = 3", "[5] x = 2", "[1] x = 1",
                                          "the empty state"]
        for version in (1, 2, 3):
            row = panel.locator(f"[data-version='{version}']")
            assert row.locator(".llfabric-History-time").inner_text()[:1].isdigit()
            assert row.locator(".llfabric-History-meta").inner_text() \
                .endswith(f"version {version}")  # the version number: secondary
        # Restart Kernel: numbers start again at 1, after a row that says so
        page.locator(".lm-MenuBar-itemLabel").filter(has_text="Kernel").click()
        page.locator(".lm-Menu-itemLabel").filter(has_text="Restart Kernel…").first.click()
        page.locator(".jp-Dialog-button").filter(has_text="Restart").click()
        assert _wait_until(lambda: (_session_status(server, lab.session) or {})
                           .get("version") == 4)
        page.locator("[data-llfabric=status]").filter(has_text=lab.session) \
            .wait_for(timeout=60_000)
        cells.nth(0).locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")  # `x = 1` again, as [1]
        panel.filter(has_text=f"session {lab.session} · version 5").wait_for(timeout=60_000)
        assert rows.all_inner_texts() == ["[1] x = 1", "restart", "[6] x = 3",
                                          "[5] x = 2", "[1] x = 1", "the empty state"]
        page.screenshot(path=str(tmp_path / "history.png"))  # for the record


def _toggle_cell_starts(page) -> None:
    """The extension's setting, as the command palette's "Show How Cells Started on llfabric"
    turns it on or off."""
    page.keyboard.press("Control+Shift+c")
    page.locator(".lm-CommandPalette-input").fill("Show How Cells Started")
    page.locator(".lm-CommandPalette-item").filter(has_text="Show How Cells Started").first \
        .click()


def test_a_cell_shows_how_it_started_beside_its_prompt_once_turned_on(
        server: RunningServer, page, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _notebook(server, page, tmp_path, request, "x = 41", "", "%llfabric status") as lab:
        cells = page.locator(".jp-Notebook .jp-Cell")
        prompts = [cells.nth(at).locator(".jp-InputPrompt") for at in range(3)]
        _run_each(page, cells, 1)  # on a worker started for it
        assert prompts[0].get_attribute("data-llfabric-start") is None  # off by default
        _toggle_cell_starts(page)
        page.locator(".jp-InputPrompt[data-llfabric-start=cold]").wait_for(timeout=30_000)
        cells.nth(1).locator(".cm-content").click()
        page.keyboard.type("x + 1", delay=80)
        assert _wait_until(lambda: _session_status(server, lab.session)["prepared"])
        page.keyboard.press("Shift+Enter")  # on the worker the draft readied
        cells.nth(1).locator(".jp-OutputArea-output").filter(has_text="42") \
            .wait_for(timeout=60_000)
        page.locator(".jp-InputPrompt[data-llfabric-start=prepared]").wait_for(timeout=30_000)
        assert [p.get_attribute("data-llfabric-start") for p in prompts[:2]] == \
            ["cold", "prepared"]
        shown = prompts[1].evaluate("p => getComputedStyle(p, '::after').content")
        assert shown == '"prepared"' and "readied while it was edited" in \
            prompts[1].get_attribute("title")
        page.screenshot(path=str(tmp_path / "cell-starts.png"))  # for the record
        page.keyboard.press("Shift+Enter")  # %llfabric status: the same word
        cells.nth(2).locator(".jp-OutputArea-output") \
            .filter(has_text="its latest cell started prepared").wait_for(timeout=60_000)
        _toggle_cell_starts(page)  # off again
        assert _wait_until(lambda: page.locator(".jp-InputPrompt[data-llfabric-start]")
                           .count() == 0)

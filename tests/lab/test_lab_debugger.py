"""JupyterLab's debugger on a notebook of the llfabric kernel, in Chromium: a breakpoint set in
a cell's gutter stops the cell in its worker, and the variables panel shows the cell's values."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import RunningServer
from test_lab_browser import _notebook, page, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

CELL = "a = 41\nb = a + 1\nprint('b is', b)"


def test_a_breakpoint_stops_the_cell_and_the_variables_panel_reads_it(
        server: RunningServer, page, tmp_path: Path,  # noqa: F811
        request: pytest.FixtureRequest) -> None:
    with _notebook(server, page, tmp_path, request, CELL):
        bug = page.locator(".jp-DebuggerBugButton")
        bug.click()  # the debugger, for this notebook
        page.locator(".jp-DebuggerBugButton[aria-pressed=true]").wait_for(timeout=60_000)
        page.locator("[data-id=jp-debugger-sidebar]").click()  # its panels
        # the debugger's session is this notebook's (it takes breakpoints from then on)
        page.locator(".jp-DebuggerSidebar").filter(has_text="work.ipynb").wait_for(
            timeout=60_000)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(0)
        # a breakpoint on line 2 (the gutter's first element is its spacer)
        cell.locator(".cm-breakpoint-gutter .cm-gutterElement").nth(2).dispatch_event(
            "mousedown")
        page.locator(".jp-DebuggerBreakpoint").wait_for(timeout=30_000)
        cell.locator(".cm-content").click()
        page.keyboard.press("Control+Enter")
        page.locator(".jp-DebuggerPausedOverlay").wait_for(timeout=60_000)
        variables = page.locator(".jp-DebuggerVariables")
        variables.get_by_text("a", exact=True).wait_for(timeout=60_000)
        shown = variables.inner_text()
        assert "41" in shown and "Out" not in shown  # the cell's values, not IPython's
        page.screenshot(path=str(tmp_path / "stopped.png"))  # what a user sees, for the record
        page.locator(".jp-DebuggerPausedButton").first.click()  # continue
        cell.locator(".jp-OutputArea-output").filter(has_text="b is 42").wait_for(
            timeout=60_000)

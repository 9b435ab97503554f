"""Live drafts in JupyterLab: the share of cells whose worker was ready when run was pressed.

A scripted typist in Chromium (Playwright, the system's chromium) enters the code cells of corpus
notebooks into a new, unsaved notebook of a real JupyterLab with the llfabric extension and
kernel, spreading each cell's text over T seconds, then presses Shift+Enter and waits for the
cell. The server keeps no worker after a cell (keep_warm=0), so a worker ready for a cell came
from a draft of the text being typed. The server's metrics tell how each cell's worker was
readied: `draft` (by a draft of its text; its readying may still be finishing when run is
pressed, which the mean visible delay, execute received to code running, shows), `draft+load` (a
draft, but state was missing) or `cold` (no draft in time).

    PYTHONPATH=$PWD .venv/bin/python bench/lab_draft_readiness.py [--seconds 1 2 5] [NOTEBOOK...]
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))

from helpers import serving  # noqa: E402
from lab_server import BUILT, CHROMIUM, jupyterlab  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

DEFAULT = ["corpus/learn-python3/beginner_07_functions.ipynb",
           "corpus/learn-python3/beginner_11_classes.ipynb"]
CHUNK = 4  # characters the typist enters at a time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _paths(metrics_url: str) -> dict[str, float]:
    """Cells run so far, by how their worker was readied; `delay`: their visible delays' sum."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    counts: dict[str, float] = {}
    for match in re.finditer(r'^llfabric_cells_total\{path="([^"]+)",status="[^"]+"\} (\S+)$',
                             text, re.M):
        counts[match[1]] = counts.get(match[1], 0) + float(match[2])
    delay = re.search(r"^llfabric_cell_visible_delay_seconds_sum (\S+)$", text, re.M)
    counts["delay"] = float(delay[1]) if delay else 0.0
    return counts


def _type_cells(page, cells: list[str], seconds: float) -> None:
    for source in cells:
        active = page.locator(".jp-Notebook .jp-Cell.jp-mod-active .cm-content")
        active.click()
        chunks = [source[i:i + CHUNK] for i in range(0, len(source), CHUNK)]
        for chunk in chunks:  # insertText: no auto-indent, the text as it is in the notebook
            page.keyboard.insert_text(chunk)
            time.sleep(seconds / len(chunks))
        count = page.locator(".jp-Notebook .jp-Cell").count()
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-Notebook .jp-Cell").nth(count - 1) \
            .locator(".jp-InputPrompt").filter(has_text=re.compile(r"\[\d+\]")) \
            .wait_for(timeout=120_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=DEFAULT)
    parser.add_argument("--seconds", nargs="+", type=float, default=[1.0, 2.0, 5.0])
    args = parser.parse_args()
    if CHROMIUM is None or not (BUILT / "package.json").is_file():
        sys.exit("needs chromium on PATH and the built extension (make labextension)")
    cells = [c.source for path in args.notebooks
             for c in nbformat.read(str(REPO / path), as_version=4).cells
             if c.cell_type == "code" and c.source.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port = _free_port()
        with serving(root / "store", keep_warm=0, metrics_bind=f"127.0.0.1:{port}") as server, \
                sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            print(f"{len(cells)} cells of {', '.join(args.notebooks)}")
            print("seconds typing  cells  draft  draft+load  cold  share draft  mean delay")
            for seconds in args.seconds:
                session = f"bench-{uuid.uuid4().hex[:8]}"
                work = root / session
                work.mkdir()
                before = _paths(f"http://127.0.0.1:{port}/metrics")
                with jupyterlab(work, server.address, session) as url:
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    page.goto(f"{url}/lab")
                    page.locator(".jp-LauncherCard[title*='llfabric']").first.click()
                    page.locator("[data-llfabric=status]").filter(has_text=session) \
                        .wait_for(timeout=120_000)
                    _type_cells(page, cells, seconds)
                    page.close()
                after = _paths(f"http://127.0.0.1:{port}/metrics")
                runs = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                delay = runs.pop("delay")
                ready = runs.get("draft", 0)
                total = sum(runs.values())
                print(f"{seconds:14.0f}  {total:5.0f}  {ready:5.0f}  "
                      f"{runs.get('draft+load', 0):10.0f}  {runs.get('cold', 0):4.0f}  "
                      f"{ready / total if total else 0:11.0%}  "
                      f"{1000 * delay / total if total else 0:7.0f} ms")
            browser.close()


if __name__ == "__main__":
    main()

"""The notebook file behind a kernel: where the next cell's source comes from for drafts.

The kernel sees neither the notebook nor keystrokes; JupyterLab and Notebook send the id of the
executed cell (`cellId` in the execute request's metadata) and start the kernel with
`JPY_SESSION_NAME` naming the notebook's path, so the cell after it can be read from disk.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import xxhash

from ..protocol import as_session_name

log = logging.getLogger(__name__)


def find_notebook(env: dict[str, str] | None = None) -> Path | None:
    """The notebook this kernel serves, if the frontend said which and it is on disk."""
    env = os.environ if env is None else env
    name = env.get("JPY_SESSION_NAME")
    if not name:
        return None
    path = Path(name)
    # The server names it relative to its root; the kernel starts in the notebook's folder.
    for candidate in (path, Path.cwd() / path.name):
        if candidate.suffix == ".ipynb" and candidate.is_file():
            return candidate.resolve()
    return None


def session_name(notebook: Path | None, fallback: str) -> str:
    """A session name that survives kernel restarts: the notebook's, else `fallback`'s."""
    if notebook is None:
        base, tag = fallback, ""
    else:
        base, tag = notebook.stem, "-" + xxhash.xxh64_hexdigest(str(notebook).encode())[:8]
    return as_session_name(base) + tag


def next_cell_source(notebook: Path, cell_id: str) -> str | None:
    """The source of the code cell after `cell_id` in the notebook as saved, if there is one.

    Read as the JSON it is, not with nbformat: importing nbformat (and jsonschema) would take
    seconds of the kernel's start."""
    try:
        nb = json.loads(notebook.read_bytes())
        cells = [cell for cell in nb["cells"] if isinstance(cell, dict)]
    except Exception as exc:  # a notebook being saved, or not one: no draft, never a failure
        log.info("cannot read %s for a draft: %s", notebook, exc)
        return None
    ids = [cell.get("id") for cell in cells]
    if cell_id not in ids:
        return None
    for cell in cells[ids.index(cell_id) + 1:]:
        if cell.get("cell_type") == "code":
            source = cell.get("source", "")
            if isinstance(source, list) and all(isinstance(line, str) for line in source):
                return "".join(source)  # a file's source is a string or a list of lines
            return source if isinstance(source, str) else None
    return None

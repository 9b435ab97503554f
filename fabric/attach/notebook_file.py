"""The notebook file behind a kernel: which session is its, and where the next cell's source
comes from for drafts.

The kernel sees neither the notebook nor keystrokes; JupyterLab and Notebook send the id of the
executed cell (`cellId` in the execute request's metadata) and start the kernel with
`JPY_SESSION_NAME` naming the notebook's path, so the cell after it can be read from disk.

A notebook's session is its own, not its path's: its metadata holds `{"session", "path"}`
(`META`), which the frontend extension (labextension/) writes once the kernel has said which
session it opened, and keeps as the notebook is renamed. A notebook whose metadata names another
path was moved (it keeps its session) unless the notebook at that path names the same session:
then it is a copy, and a new session. A notebook without it (a new one) is a new session.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import xxhash

from ..protocol import as_session_name, valid_session_name

log = logging.getLogger(__name__)

META = "llfabric"  # the notebook metadata's key


def frontend_name(env: dict[str, str] | None = None) -> str | None:
    """The notebook's path as the frontend names it (relative to its root), if it said."""
    return (os.environ if env is None else env).get("JPY_SESSION_NAME") or None


def find_notebook(env: dict[str, str] | None = None) -> Path | None:
    """The notebook this kernel serves, if the frontend said which and it is on disk."""
    name = frontend_name(env)
    if not name:
        return None
    path = Path(name)
    # The server names it relative to its root; the kernel starts in the notebook's folder.
    for candidate in (path, Path.cwd() / path.name):
        if candidate.suffix == ".ipynb" and candidate.is_file():
            return candidate.resolve()
    return None


def session_name(notebook: Path | None, fallback: str, name: str | None = None) -> str:
    """The notebook's session (see the top): the one its metadata names, else a new one named
    after the notebook and `fallback`, the kernel's name (the same across its restarts);
    `name`: the notebook's path as the frontend names it. Without a notebook, `fallback`."""
    if notebook is None:
        return as_session_name(fallback)
    saved = _read(notebook)
    mine = _identity(saved)
    if mine is not None:
        session, path = mine
        if name is None or path == name or _identity(_read(_beside(notebook, name, path))) \
                != (session, path):
            return session  # the same notebook, or moved
    elif saved is not None and _has_run(saved):  # from before identities: its path named it
        return as_session_name(notebook.stem) + "-" + _tag(str(notebook))
    return as_session_name(notebook.stem) + "-" + _tag(fallback)


def _tag(text: str) -> str:
    return xxhash.xxh64_hexdigest(text.encode())[:8]


def _read(notebook: Path) -> dict | None:
    """A notebook file's JSON (not with nbformat: importing it takes seconds of a kernel's
    start), or None where there is none."""
    try:
        nb = json.loads(notebook.read_bytes())
    except (OSError, ValueError) as exc:  # not saved yet, being saved, or not a notebook
        log.info("cannot read %s: %s", notebook, exc)
        return None
    return nb if isinstance(nb, dict) else None


def _identity(nb: dict | None) -> tuple[str, str] | None:
    """(session, path) from a notebook's metadata, where it holds a valid one."""
    meta = nb.get("metadata") if nb is not None else None
    mine = meta.get(META) if isinstance(meta, dict) else None
    if not isinstance(mine, dict):
        return None
    session, path = mine.get("session"), mine.get("path")
    if isinstance(session, str) and valid_session_name(session) and isinstance(path, str):
        return session, path
    return None


def _beside(notebook: Path, name: str, other: str) -> Path:
    """Where the notebook the frontend names `other` is, this one (`notebook`) being `name`."""
    parts = Path(name).parts
    root = Path("/") if Path(name).is_absolute() or len(parts) > len(notebook.parents) \
        else notebook.parents[len(parts) - 1]
    return root / other


def _has_run(nb: dict) -> bool:
    cells = nb.get("cells")
    return isinstance(cells, list) and any(
        isinstance(cell, dict) and cell.get("execution_count") is not None for cell in cells)


def next_cell_source(notebook: Path, cell_id: str) -> str | None:
    """The source of the code cell after `cell_id` in the notebook as saved, if there is one."""
    nb = _read(notebook)
    cells = nb.get("cells") if nb is not None else None
    if not isinstance(cells, list):  # a notebook being saved, or not one: no draft
        return None
    cells = [cell for cell in cells if isinstance(cell, dict)]
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

"""Inputs a server must survive with a typed answer: a full disk at commit, notebooks with any
file name. (Oversized and malformed frames: tests/integration/test_server.py.)"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import helpers
import nbformat
import pytest
from helpers import execute, open_session, serving, text
from nbformat.v4 import new_code_cell, new_notebook

from fabric.errors import RemoteError
from fabric.snapshot import Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk() -> Iterator[Path]:
    with helpers.small_disk("48m") as path:
        yield path


def _blobs(store: Path) -> set[str]:
    return {p.name for p in (store / "blobs").rglob("*") if p.is_file()}


def test_a_full_disk_at_commit_is_disk_full_and_leaves_no_chunks(small_disk: Path,
                                                                 tmp_path: Path) -> None:
    store = small_disk / "store"
    with serving(store, keep_warm=0) as server, server.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "import numpy as np\nsmall = np.arange(10)")
        before = _blobs(store)
        with pytest.raises(RemoteError) as err:  # 64 MB of 16 MB chunks on a 48 MB disk
            execute(client, session, "big = np.random.default_rng(0).random(8 << 20)")
        assert err.value.kind == "disk_full", err.value.message
        assert _blobs(store) == before  # its chunks went at once, not at gc
        _, outputs = execute(client, session, "print(small.sum(), 'big' in dir())")
        assert text(outputs) == "45 False\n"  # the session goes on from its last commit
        assert server.alive()
    assert Store(store).head(session) is not None


@pytest.mark.parametrize("name", ["my analysis.ipynb", "données.ipynb", "a+b.ipynb",
                                  ".hidden.ipynb"])
def test_run_names_the_session_after_any_notebook_file(server, name: str,
                                                       tmp_path: Path) -> None:
    nb = tmp_path / name
    nbformat.write(new_notebook(cells=[new_code_cell("print(6 * 7)")]), str(nb))
    result = subprocess.run([sys.executable, "-m", "cli.main", "run", str(nb), "--connect",
                             server.address], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "42" in result.stdout

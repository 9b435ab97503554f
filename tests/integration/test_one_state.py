"""One state, whichever path: the state a session commits does not depend on where its cells
ran. The same cell sequences run on the session's kept worker (warm), on a fresh worker per cell
loaded with its closure (fresh), on a template copy per cell (template) and on a pinned worker
resumed from disk before the cell that deletes or rebinds (cool); the state after every cell
(its variables' names, groups and value fingerprints, its imports: the version it committed, or
the one before where it changed nothing) and every cell's outputs must equal the fresh run's.
Real servers, workers and CRIU.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from helpers import execute, open_session, require_criu, serving, text
from nbformat.v4 import new_code_cell, new_notebook

from fabric.audit import fingerprints
from fabric.client import Client
from fabric.snapshot import Store, codec, history

# name: (cells, what the last one prints)
SEQUENCES = {
    "del": (["x = 1\ny = [x]", "del x", "print('x' in dir(), y)"], "False [1]\n"),
    "rebound into another group": (
        ["a = [1]\nb = a\nc = [2]\nd = c", "b = c", "b.append(3)\nprint(a, b, c, d)"],
        "[1] [2, 3] [2, 3] [2, 3]\n"),
    "moved between groups": (
        ["p = [0]\nq = [1]\nr = {'p': p}", "r['q'] = q\ndel r['p']",
         "p.append(9)\nq.append(8)\nprint(p, r)"], "[0, 9] {'q': [1, 8]}\n"),
    "raises half-way": (
        ["x = 1\ny = [0]", "y.append(1)\nz = 2\ndel x\n1 / 0\nw = 3",
         "print([k for k in ('x', 'y', 'z', 'w') if k in globals()], y)"], "['y', 'z'] [0, 1]\n"),
    "module aliases": (
        ["import json as js\nimport math", "js = 3\ndel math", "print(js, 'math' in dir())"],
        "3 False\n"),
    "globals of functions": (
        ["def put():\n    global g\n    g = [1]\n\ndef drop():\n    global g\n    del g",
         "put()", "drop()", "print('g' in dir())"], "False\n"),
    "the namespace": (["k = 1\nm = 2", "globals().pop('k')", "print('k' in dir(), m)"],
                      "False 2\n"),
}
PIN = "pinned = (i for i in range(3))"  # cannot be saved: the session keeps its worker
PATHS = {
    "warm": {"keep_warm": 300, "linger": 0},
    "fresh": {"keep_warm": 0},
    "template": {"keep_warm": 0, "worker_source": "template"},
    "cool": {"keep_warm": 300, "cool_after": 1, "linger": 0},
}


def committed(store: Path, session: str) -> list[dict]:
    """Every committed version, oldest first: its variables' groups and fingerprints, imports
    and cell status."""
    versions = []
    for _, manifest in reversed(history.log(Store(store), session)):
        ns: dict = {}
        variables, groups = {}, set()
        for group in manifest.groups:
            values = codec.loads(Store(store).get_object(group.blob), ns)
            groups.add(frozenset(group.names))
            variables |= fingerprints(values, list(group.names))
        versions.append({"variables": variables, "groups": groups,
                         "imports": manifest.imports, "status": manifest.cell.get("status"),
                         "cell": int(manifest.cell.get("execution_count", 0))})
    return versions


def after_each(versions: list[dict], cells: range) -> list[dict]:
    """The state after each cell numbered in `cells`: the newest version committed by then."""
    return [{key: state[key] for key in ("variables", "groups", "imports")}
            for state in ([v for v in versions if v["cell"] <= n][-1] for n in cells)]


def _wait_cool(client: Client, session: str) -> None:
    deadline = time.monotonic() + 60
    while (status := next(s for s in client.status().sessions
                          if s.session == session)).tier != "cool":
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def run_sequences(path: str, tmp_path: Path) -> dict[str, tuple[list[str], list[dict]]]:
    """Each sequence in its own session on a server set up for `path`: the outputs of its cells
    and the state after each (on the cool path, without the pinning cell's)."""
    store, results = tmp_path / path, {}
    with serving(store, **PATHS[path]) as server, server.client() as client:
        for name, (cells, _) in SEQUENCES.items():
            session, outputs = open_session(client, tmp_path), []
            for i, source in enumerate([PIN, *cells] if path == "cool" else cells):
                if path == "cool" and i == 2:  # the sequence's second cell: its worker restored
                    _wait_cool(client, session)
                reply, out = execute(client, session, source)
                assert reply.get("type") == "reply", reply
                if path == "cool" and i > 0:
                    assert reply["path"] == "pinned", reply
                outputs.append(text(out))
            versions, first = committed(store, session), 1
            if path == "cool":  # the pinning cell's version and output stand apart
                outputs, versions, first = outputs[1:], versions[1:], 2
                for version in versions:
                    assert "pinned" not in version["variables"]
            results[name] = (outputs, after_each(versions, range(first, first + len(cells))))
    return results


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> dict:
    results = run_sequences("fresh", tmp_path_factory.mktemp("fresh"))
    for name, (_, last) in SEQUENCES.items():  # the reference is itself right
        assert results[name][0][-1] == last, name
    return results


@pytest.mark.parametrize("path", ["warm", "template", "cool"])
def test_every_path_commits_what_fresh_workers_commit(path: str, fresh: dict,
                                                      tmp_path: Path) -> None:
    if path != "warm":
        require_criu(f"the {path} path")
    results = run_sequences(path, tmp_path)
    for name in SEQUENCES:
        outputs, versions = results[name]
        assert outputs == fresh[name][0], name
        for number, (got, want) in enumerate(zip(versions, fresh[name][1], strict=True), 1):
            assert got == want, f"{name}: the state after cell {number} differs on the " \
                f"{path} path"


def test_a_del_stays_deleted_through_llfabric_run_and_a_restart(tmp_path: Path) -> None:
    nb = tmp_path / "del.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in
                                       ("x = 1", "del x", "print('x' in dir())")]), str(nb))
    store = tmp_path / "store"
    with serving(store, linger=0) as server:  # warm workers, parked after every cell
        result = subprocess.run(
            [sys.executable, "-m", "cli.main", "run", str(nb), "--connect", server.address,
             "--session", "del"], cwd=Path(__file__).resolve().parents[2],
            capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "False" in result.stdout and "True" not in result.stdout, result.stdout
        assert " warm " in result.stdout  # the cells after the first ran on the kept worker
    assert "x" not in committed(store, "del")[-1]["variables"]
    with serving(store) as server, server.client() as client:
        client.call("open", session="del", cwd=str(tmp_path))
        _, outputs = execute(client, "del", "print('x' in dir())")
        assert text(outputs) == "False\n"

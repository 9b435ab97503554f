"""`llfabric run` and friends as a user runs them: real processes, real notebooks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
from helpers import execute
from nbformat.v4 import new_code_cell, new_notebook

LLFABRIC = [sys.executable, "-m", "cli.main"]
ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*LLFABRIC, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _notebook(path: Path, *sources: str) -> Path:
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), str(path))
    return path


def test_run_prints_outputs_table_and_writes_the_executed_notebook(server, tmp_path) -> None:
    nb = _notebook(tmp_path / "ok.ipynb", "x = 20", "print(x + 1)", "x * 2")
    out = tmp_path / "out.ipynb"
    result = _run("run", str(nb), "--connect", server.address, "--think-time", "0.2",
                  "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "21" in result.stdout and "40" in result.stdout
    assert "visible" in result.stdout and "pinned session" in result.stdout
    cells = nbformat.read(str(out), as_version=4).cells
    assert cells[1].outputs[0].text == "21\n"
    assert cells[2].outputs[0].data["text/plain"] == "40"
    assert [c.execution_count for c in cells] == [1, 2, 3]


def test_run_fails_when_a_cell_shows_state_lost(server, tmp_path) -> None:
    # `g` cannot be saved, and its cell writes a file, so it is never run again: when the
    # worker holding it dies between cells, the next cell shows it lost, and the run fails
    nb = _notebook(tmp_path / "lost.ipynb",
                   "g = (i for i in range(3))\nopen('out.txt', 'a').write('x')",
                   "import os, subprocess\nsubprocess.Popen(['sh', '-c', "
                   "f'sleep 0.5; kill -9 {os.getpid()}'])",
                   "print('after')")
    result = _run("run", str(nb), "--connect", server.address, "--think-time", "2")
    assert "after" in result.stdout and "held g (which could not be saved) is gone" in result.stderr
    assert result.returncode == 1, result.stdout


def test_run_applies_a_display_update_to_the_cell_that_showed_it(server, tmp_path) -> None:
    nb = _notebook(tmp_path / "display.ipynb",
                   "h = display('first', display_id=True)\nprint('shown')",
                   "h.update('second')", "display('mine', display_id='m')",
                   "from IPython.display import update_display\nupdate_display('new', "
                   "display_id='m')\nprint('updated')")
    out = tmp_path / "out.ipynb"
    result = _run("run", str(nb), "--connect", server.address, "--output", str(out))
    assert result.returncode == 0, result.stderr
    cells = nbformat.read(str(out), as_version=4).cells
    assert cells[0].outputs[0].data["text/plain"] == "'second'"  # as a kernel's frontend shows
    assert cells[0].outputs[1].text == "shown\n" and cells[1].outputs == []
    assert cells[2].outputs[0].data["text/plain"] == "'new'"
    assert [o.text for o in cells[3].outputs] == ["updated\n"]


def test_run_shows_llfabric_notices_in_its_table_not_in_the_outputs(server, tmp_path) -> None:
    nb = _notebook(tmp_path / "pin.ipynb", "g = (i for i in range(3))", "next(g)")
    out = tmp_path / "out.ipynb"
    result = _run("run", str(nb), "--connect", server.address, "--output", str(out))
    assert result.returncode == 0, result.stderr
    cells = nbformat.read(str(out), as_version=4).cells
    assert cells[0].outputs == [] and cells[1].outputs[0].data["text/plain"] == "0"
    assert "cannot be saved" not in result.stderr
    [row] = [line for line in result.stdout.splitlines() if line.startswith("   0 ")]
    assert row.endswith("ok      pinned")  # the notices column
    assert "notices:\n  cell 0: g cannot be saved" in result.stdout


def test_run_stops_at_a_cell_error_and_exits_nonzero(server, tmp_path) -> None:
    nb = _notebook(tmp_path / "err.ipynb", "1 / 0", "print('never')")
    result = _run("run", str(nb), "--connect", server.address)
    assert result.returncode == 1
    assert "ZeroDivisionError" in result.stderr
    assert "never" not in result.stdout


def test_run_refuses_an_invalid_notebook(tmp_path) -> None:
    bad = tmp_path / "bad.ipynb"
    bad.write_text('{"cells": "not a list", "nbformat": 4}')
    result = _run("run", str(bad), "--connect", "ipc:///nonexistent/x.sock")
    assert result.returncode != 0
    assert "not a valid notebook" in result.stderr
    missing = _run("run", str(tmp_path / "missing.ipynb"))
    assert missing.returncode != 0 and "no such notebook" in missing.stderr


def test_run_reports_an_unreachable_server(tmp_path) -> None:
    nb = _notebook(tmp_path / "ok.ipynb", "1")
    result = _run("run", str(nb), "--connect", f"ipc://{tmp_path}/none.sock")
    assert result.returncode != 0 and "no llfabric server answers" in result.stderr


def test_run_starts_an_embedded_server_when_none_answers(tmp_path) -> None:
    nb = _notebook(tmp_path / "ok.ipynb", "y = 6 * 7", "y")
    env_store = tmp_path / "store"
    result = subprocess.run(
        [*LLFABRIC, "run", str(nb), "--store", str(env_store)], cwd=ROOT, capture_output=True,
        text=True, timeout=300,
        env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "rt")})
    assert result.returncode == 0, result.stderr
    assert "42" in result.stdout and "embedded server" in result.stderr
    assert (env_store / "sessions").iterdir()
    assert not (tmp_path / "rt" / "llfabric" / "server.sock").exists()  # stopped again


def test_status_shows_the_server(server) -> None:
    result = _run("status", "--connect", server.address)
    assert result.returncode == 0, result.stderr
    assert "slots" in result.stdout and "zygote" in result.stdout


def test_status_shows_slots_and_each_sessions_tier(server, client, session) -> None:
    reply, _ = execute(client, session, "g = (i for i in range(3))")  # pinned: kept warm
    assert reply["unsaved"] == ["g"]
    result = _run("status", "--connect", server.address)
    assert result.returncode == 0, result.stderr
    assert "  slot 0: free" in result.stdout
    assert "workers (zygote)" in result.stdout
    line = next(x for x in result.stdout.splitlines() if x.startswith(f"session {session}:"))
    assert ", warm (" in line and ", pinned" in line


def test_audit_reports_each_cell_and_refuses_a_non_notebook(tmp_path: Path) -> None:
    path = _notebook(tmp_path / "small.ipynb", "a = [1]\nb = 2", "a.append(b)")
    result = _run("audit", str(path), "--verify", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:3]]
    assert rows[1][:2] == ["1", "2/2"]  # the second cell's closure: a and b, of two variables
    (tmp_path / "notes.txt").write_text("not a notebook")
    bad = _run("audit", str(tmp_path / "notes.txt"), cwd=tmp_path)
    assert bad.returncode != 0
    assert "not a valid notebook" in bad.stderr


def test_store_verify_repairs_from_another_store_and_names_what_it_cannot(tmp_path) -> None:
    from fabric.snapshot import Group, Manifest, Store, dumps

    store, backup = Store(tmp_path / "store"), Store(tmp_path / "backup")
    good, bad = (store.put_object(dumps({k: k * 100}, {})) for k in "ab")
    backup.put_object(dumps({"a": "a" * 100}, {}))
    manifest = Manifest(session="s", version=1, groups=(Group(good, ("a",)), Group(bad, ("b",))))
    store.set_head("s", store.put_manifest(manifest.encode()), None)
    for blob in (good, bad):
        path = store.disk.path(blob)
        path.write_bytes(path.read_bytes()[:-1] + b"!")
    result = _run("store", "verify", "--store", str(store.root), "--repair",
                  "--from", str(backup.root))
    assert result.returncode == 1
    assert f"repaired blob {good}" in result.stdout
    assert bad in result.stderr and "no good copy" in result.stderr
    assert "sessions s need it" in result.stderr
    assert Store(store.root).get_object(good)  # whole again


def test_store_verify_since_last_checks_what_was_written_after_the_last_whole_verify(
        tmp_path) -> None:
    from fabric.snapshot import Store, history

    store = Store(tmp_path / "store")
    history.verify(store)  # whole: on record
    first = _run("store", "verify", "--store", str(store.root), "--since-last")
    assert first.returncode == 0, first.stderr
    assert "0 manifests, 0 blobs (0.0 MB) written since" in first.stdout
    (store.root / history.VERIFIED).unlink()
    none = _run("store", "verify", "--store", str(store.root), "--since-last")
    assert "no full verify found it whole yet: checking everything" in none.stdout

"""The store under a real server: delta saves, checkout, tampering, as a session sees them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import execute, execute_in_thread, pid_of_running_cell, text

from fabric.client import Client
from fabric.errors import RemoteError
from fabric.snapshot import Manifest, Store

ROOT = Path(__file__).resolve().parent.parent.parent


def _head(server, session: str) -> Manifest:
    store = Store(server.store)
    return Manifest.decode(store.get_manifest(store.head(session)))


def _files(store: Store, blob: str) -> dict[Path, int]:
    paths = [store.disk.path(b) for b in [blob, *store.object_chunks(blob)]]
    return {p: p.stat().st_ino for p in paths}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)


def test_groups_a_cell_cannot_have_changed_are_not_written(server, client: Client,
                                                           session: str) -> None:
    # the generator pins the session's worker, which then holds `big` across the cells
    reply, _ = execute(client, session, "import numpy as np\n"
                                        "big = np.arange(3_000_000.0)\ngen = (i for i in [1])")
    assert reply["unsaved"] == ["gen"]
    blob = _head(server, session).variables()["big"].blob
    store = Store(server.store)
    before = _files(store, blob)
    assert len(before) > 1  # an index and its chunks
    reply, _ = execute(client, session, "small = 1")  # does not touch big
    assert reply["path"].startswith("pinned")
    reply, _ = execute(client, session, "total = float(big.sum())")  # reads big: fingerprinted
    assert _head(server, session).variables()["big"].blob == blob
    assert _files(store, blob) == before  # neither rewritten nor even touched
    execute(client, session, "big[0] = -1.0")
    changed = _head(server, session).variables()["big"].blob
    assert changed != blob
    assert set(_files(store, changed)) - set(before) == {
        store.disk.path(changed), store.disk.path(store.object_chunks(changed)[0])}


def test_checkout_from_the_cli_is_where_the_next_cell_runs(server, client: Client,
                                                           session: str) -> None:
    execute(client, session, "x = 'first'")
    execute(client, session, "x = 'second'\ny = 2")
    version = _head(server, session).version
    result = _cli("store", "log", session, "--store", str(server.store))
    assert result.returncode == 0, result.stderr
    assert "x = 'second'" in result.stdout and "MB" in result.stdout
    result = _cli("store", "checkout", session, str(version - 1), "--store", str(server.store))
    assert result.returncode == 0, result.stderr
    _, outputs = execute(client, session, "print(x, 'y' in globals())")
    assert text(outputs) == "first False\n"
    assert _cli("store", "verify", "--store", str(server.store)).returncode == 0
    result = _cli("store", "gc", "--store", str(server.store))
    assert result.returncode == 0 and "removed 0 files" in result.stdout, result.stderr
    _, outputs = execute(client, session, "print(x)")  # gc kept what the session uses
    assert text(outputs) == "first\n"


def test_a_tampered_manifest_is_refused_and_the_server_keeps_serving(
        server, client: Client, session: str, tmp_path: Path) -> None:
    execute(client, session, "x = 41")
    client.call("close", session=session)
    store = Store(server.store)
    path = server.store / "manifests" / store.head(session)
    original = path.read_bytes()
    path.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    try:
        with pytest.raises(RemoteError) as err:
            client.call("open", session=session, cwd=str(tmp_path))
        assert err.value.kind == "store"
    finally:
        path.write_bytes(original)
    assert client.ping() and server.alive()
    client.call("open", session=session, cwd=str(tmp_path))
    assert text(execute(client, session, "print(x + 1)")[1]) == "42\n"


def test_a_flipped_chunk_fails_the_load_and_the_session_keeps_its_version(
        server, client: Client, session: str) -> None:
    execute(client, session, "import numpy as np\nbig = np.arange(3_000_000.0)")
    manifest = _head(server, session)
    store = Store(server.store)
    chunk = store.disk.path(store.object_chunks(manifest.variables()["big"].blob)[0])
    original = chunk.read_bytes()
    chunk.write_bytes(b"\xff" + original[1:])  # the first double, 0.0, is all zeros
    try:
        with pytest.raises(RemoteError) as err:
            execute(client, session, "big[1]")
        assert err.value.kind == "load" and "corrupt" in err.value.message
        assert _head(server, session).version == manifest.version
    finally:
        chunk.write_bytes(original)
    assert text(execute(client, session, "print(big[1])")[1]) == "1.0\n"


def test_checkout_from_the_cli_is_refused_while_a_cell_runs(server, client: Client,
                                                            session: str, tmp_path: Path) -> None:
    """Moved behind the server's back, the head would refuse the running cell's commit: the
    server that has the session open checks it out, and not while a cell runs."""
    execute(client, session, "x = 'first'")
    go = tmp_path / "go"
    thread, ran = execute_in_thread(
        server, session, f"import os, time\nwhile not os.path.exists({str(go)!r}):\n"
                         "    time.sleep(0.05)\nx = 'second'")
    pid_of_running_cell(server, session)
    env = {**os.environ, "LLFABRIC_BIND": server.address}
    refused = _cli("store", "checkout", session, "1", "--store", str(server.store), env=env)
    assert refused.returncode == 1 and "running a cell" in refused.stderr, refused.stderr
    go.touch()
    thread.join()
    assert ran["reply"]["status"] == "ok" and _head(server, session).version == 2
    done = _cli("store", "checkout", session, "1", "--store", str(server.store), env=env)
    assert done.returncode == 0, done.stderr
    _, outputs = execute(client, session, "print(x)")
    assert text(outputs) == "first\n"

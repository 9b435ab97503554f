"""The cool tier with real CRIU: a session's kept worker dumped to disk when idle, restored and
woken on the next cell, with state that only that process holds.

Needs root, CRIU, pycriu and llfabric-init (skipped without them, failed under CI).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from helpers import execute, open_session, require_criu, serving, start_server, text

from fabric.status import SessionStatus

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _needs_criu() -> None:
    require_criu("the cool tier")


def _session_status(client, session: str) -> SessionStatus:
    return next(s for s in client.status().sessions if s.session == session)


def _wait_tier(client, session: str, tier: str) -> SessionStatus:
    deadline = time.monotonic() + 30
    while (status := _session_status(client, session)).tier != tier:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status


@pytest.mark.parametrize("source", ["zygote", "template"])
def test_a_cooled_session_continues_its_half_consumed_generator(tmp_path: Path,
                                                                source: str) -> None:
    with serving(tmp_path / "store", linger=0, cool_after=1, worker_source=source) as server, \
            server.client() as client:
        session = open_session(client, tmp_path)
        if source == "template":  # a first cell makes the family's template
            execute(client, session, "pass")
            deadline = time.monotonic() + 60
            while not any(t.state == "ready"
                          for t in client.status().templates):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        reply, outputs = execute(client, session,
                                 "kept = 'committed'\ng = (i for i in range(10))\nnext(g)")
        assert reply["unsaved"] == ["g"], outputs
        assert _session_status(client, session).tier == "warm"

        cool = _wait_tier(client, session, "cool")
        assert cool.memory > 0 and cool.worker is None  # on disk, no process

        sent = time.monotonic()
        reply, outputs = execute(client, session, "print(next(g), next(g), kept)")
        waited = time.monotonic() - sent
        assert (reply["status"], reply["path"], reply["source"], reply["start"]) == (
            "ok", "pinned", "cool", "restored"), outputs
        assert text(outputs) == "1 2 committed\n"
        # the restore readies its worker, and is part of the wait, read on the server's clock
        # (the restored worker's runs in a time namespace of its own)
        timings = reply["timings"]
        assert 0 < timings["prepare"] <= timings["visible_delay"] < waited, timings

        # Cooled again, and woken by a draft this time: the cell finds it back on the host.
        _wait_tier(client, session, "cool")
        client.call("draft", session=session, source="next(g)")
        reply, outputs = execute(client, session, "next(g)")
        assert text(outputs) == "3\n" and reply["source"] == "cool"
        assert reply["start"] == "restored"  # from disk, while the cell was edited


def test_a_worker_that_cannot_be_dumped_falls_back_to_the_store(tmp_path: Path) -> None:
    # An established TCP connection is state CRIU will not dump (without tcp_established):
    # cooling fails, the worker is gone, and the session goes on from its committed version,
    # telling the user what only that worker held.
    with serving(tmp_path / "store", linger=0, cool_after=1, worker_source="zygote") as server, \
            server.client() as client:
        session = open_session(client, tmp_path)
        reply, outputs = execute(client, session, (
            "import socket\nkept = 'committed'\n"
            "srv = socket.create_server(('127.0.0.1', 0))\n"
            "conn = socket.create_connection(srv.getsockname())\n"
            "peer, _ = srv.accept()"))
        assert {"conn", "peer", "srv"} <= set(reply["unsaved"]), outputs
        worker = _session_status(client, session).worker
        deadline = time.monotonic() + 30
        while _session_status(client, session).worker == worker or \
                _session_status(client, session).tier != "cold":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        reply, outputs = execute(client, session, "print(kept)")
        assert reply["status"] == "ok" and reply["path"] == "cold"
        assert "LLFabricStateLost: the worker that held" in text(outputs)
        assert text(outputs).endswith("committed\n")
        # no image left behind
        assert not any(Path(server.config.runtime_dir).glob("**/cool/*"))


def test_memory_pressure_cools_a_kept_worker_before_its_idle_time(tmp_path: Path) -> None:
    # Pressure from 1% of memory in use on: always, here. The idle time alone would be an hour.
    with serving(tmp_path / "store", linger=0, cool_after=3600, memory_pressure=1,
                 worker_source="zygote") as server, \
            server.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "g = (i for i in range(10))")
        _wait_tier(client, session, "cool")
        reply, outputs = execute(client, session, "next(g)")
        assert text(outputs) == "0\n" and reply["source"] == "cool"


def _unlink_chunks(store: Path) -> None:
    """Remove the store's chunk files, as gc does once no version names them."""
    for chunk in (store / "blobs").glob("*/*"):
        if chunk.stat().st_size > 1 << 20:
            chunk.unlink()


@pytest.mark.parametrize("unlinked", ["never", "before the dump", "after the dump"])
def test_a_cooled_worker_keeps_arrays_mapped_from_the_store(tmp_path: Path,
                                                            unlinked: str) -> None:
    # A fresh worker loads `a` as mappings of its chunk files; the worker, pinned by `g`, is
    # dumped and restored with them, whether gc unlinked the files before the dump, after it,
    # or not at all.
    with serving(tmp_path / "store", linger=0, cool_after=1, keep_warm=0,
                 worker_source="zygote") as server, server.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "import numpy as np\na = np.arange(3_000_000.0)")
        reply, outputs = execute(client, session, (
            "g = (i for i in range(10))\nnext(g)\ntotal = a.sum()\n"
            "print(sum('/blobs/' in line for line in open('/proc/self/maps')))"))
        assert reply["unsaved"] == ["g"] and reply["path"] != "warm", (reply, outputs)
        assert text(outputs) == "2\n"  # a's two chunks, mapped
        if unlinked == "before the dump":
            _unlink_chunks(server.store)
        _wait_tier(client, session, "cool")
        if unlinked == "after the dump":
            _unlink_chunks(server.store)
        reply, outputs = execute(client, session, "a[1] = 7\nprint(next(g), a[:3], a[-1])")
        assert (reply["status"], reply["source"]) == ("ok", "cool"), outputs
        assert text(outputs) == "1 [0. 7. 2.] 2999999.0\n"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_restored_worker_does_not_outlive_a_server_killed_outright(tmp_path: Path) -> None:
    """A restored worker has no parent-death signal (it would fire when the restoring thread
    ends): it watches its parent, and leaves once the server is gone."""
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:
        server = start_server(tmp_path / "store", Path(sockdir),
                              {**os.environ, "LLFABRIC_COOL_AFTER": "1",
                               "LLFABRIC_LINGER": "0"})
        try:
            with server.client() as client:
                session = open_session(client, tmp_path)
                execute(client, session, "g = (i for i in range(3))\nnext(g)")
                _wait_tier(client, session, "cool")
                reply, _ = execute(client, session, "next(g)")
                assert reply["source"] == "cool"
                worker = _session_status(client, session).worker
            server.process.kill()
            server.process.wait()
            deadline = time.monotonic() + 10
            while not _gone(worker):
                assert time.monotonic() < deadline, "the restored worker outlived its server"
                time.sleep(0.1)
        finally:
            if server.alive:
                server.stop()


def test_a_worker_that_ran_the_debugger_stays_warm_rather_than_cool(tmp_path: Path) -> None:
    # CRIU cannot dump a debugger's connections: a pinned worker that ran one keeps what it
    # alone holds warm, while one that did not cools in the same time
    with serving(tmp_path / "store", linger=0, cool_after=1, worker_source="zygote") as server, \
            server.client() as client:
        debugged, plain = open_session(client, tmp_path), open_session(client, tmp_path)
        for command in ("initialize", "attach"):  # a frontend's debugger, as JupyterLab starts it
            reply = client.call("debug", session=debugged, content={
                "type": "request", "seq": 1, "command": command, "arguments": {}})
            assert reply.content["success"]
        cell = "g = (i for i in range(10))\nnext(g)"
        assert execute(client, debugged, cell)[0]["unsaved"] == ["g"]
        assert execute(client, plain, cell)[0]["unsaved"] == ["g"]
        _wait_tier(client, plain, "cool")
        assert _session_status(client, debugged).tier == "warm"
        reply, outputs = execute(client, debugged, "next(g)")
        assert (text(outputs), reply["path"]) == ("1\n", "pinned")

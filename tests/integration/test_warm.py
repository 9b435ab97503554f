"""Warm workers, the default: a session's worker stays alive after its cell (parked off the GPU
on GPU hosts), so the next cell runs on it with nothing to load, until the session idles for
`keep_warm` seconds or the host runs short of memory; then it is retired and the session goes
on from the store. Real servers, real workers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import RunningServer, execute, open_session, serving, text

from fabric.client import Client
from fabric.status import SessionStatus


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # the default keep_warm; no linger: every worker is parked as soon as its cell is saved
    with serving(tmp_path_factory.mktemp("store"), linger=0) as running:
        yield running


def _status(client: Client, session: str) -> SessionStatus:
    return next(s for s in client.status().sessions if s.session == session)


def _wait_cold(client: Client, session: str) -> None:
    deadline = time.monotonic() + 30
    while (status := _status(client, session)).tier != "cold":
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def test_the_next_cell_runs_on_the_same_worker_with_nothing_loaded(warm: RunningServer,
                                                                   tmp_path: Path) -> None:
    with warm.client() as client:
        session = open_session(client, tmp_path)
        reply, _ = execute(client, session, "x = [1, 2]\nident = id(x)")
        assert reply["path"] == "cold"
        status = _status(client, session)
        assert (status.tier, status.pinned) == ("warm", False) and status.memory > 0
        reply, outputs = execute(client, session, "x.append(3)\nprint(id(x) == ident, x)")
        # the very object the first cell made: not rebuilt from the store
        assert (reply["path"], text(outputs)) == ("warm", "True [1, 2, 3]\n")
        assert _status(client, session).worker == status.worker
        assert reply["version"] == 2  # still committed after every cell


def test_a_cell_that_drops_its_streams_leaves_the_worker_whole(warm: RunningServer,
                                                               tmp_path: Path) -> None:
    """`sys.stdout = None` silences the cell that sets it; the warm worker runs the next cells
    with its streams, as a fresh worker would (IPython cannot run a cell without them)."""
    with warm.client() as client:
        session = open_session(client, tmp_path)
        reply, outputs = execute(client, session, "import sys\nsys.stdout = sys.stderr = None\n"
                                                  "print('unseen')\nkept = 1")
        assert (reply["status"], text(outputs)) == ("ok", "")
        worker = _status(client, session).worker
        reply, outputs = execute(client, session, "print(kept)\nprint(kept, file=sys.stderr)")
        streams = {name: "".join(o["text"] for o in outputs if o.get("name") == name)
                   for name in ("stdout", "stderr")}
        assert (reply["status"], reply["path"]) == ("ok", "warm")
        assert streams == {"stdout": "1\n", "stderr": "1\n"}
        assert _status(client, session).worker == worker


def test_the_warm_worker_loads_what_it_lacks(warm: RunningServer, tmp_path: Path) -> None:
    with warm.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "a = 1\nb = 2")
        client.call("close", session=session)  # the worker is retired with the session
        client.call("open", session=session, cwd=str(tmp_path))
        reply, outputs = execute(client, session, "print(a)")  # a fresh worker loads only `a`
        assert (reply["path"], reply["closure"]["names"]) == ("cold", ["a"])
        reply, outputs = execute(client, session, "print(a + b)")
        assert (reply["path"], reply["closure"]["names"]) == ("warm+load", ["a", "b"])
        assert text(outputs) == "3\n"


def test_a_warm_worker_that_dies_between_cells_costs_nothing_committed(warm: RunningServer,
                                                                       tmp_path: Path) -> None:
    with warm.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "x = 'committed'")
        psutil.Process(_status(client, session).worker).kill()
        reply, outputs = execute(client, session, "print(x)")
        # a fresh worker from the store, and no word of loss: the store held everything
        assert (reply["path"], text(outputs)) == ("cold", "committed\n")


def test_a_checkout_leaves_the_warm_worker_behind(warm: RunningServer, tmp_path: Path) -> None:
    with warm.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "x = 1")
        execute(client, session, "x = 2")
        client.call("checkout", session=session, version=1)
        reply, outputs = execute(client, session, "print(x)")
        assert (reply["path"], text(outputs)) == ("cold", "1\n")


def test_an_idle_warm_worker_is_retired_and_the_session_goes_on_from_the_store(
        tmp_path: Path) -> None:
    with serving(tmp_path / "store", keep_warm=1, linger=0) as server, server.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "x = 41")
        worker = _status(client, session).worker
        _wait_cold(client, session)
        assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == "zombie"
        reply, outputs = execute(client, session, "print(x + 1)")
        assert (reply["path"], text(outputs)) == ("cold", "42\n")


def test_memory_pressure_retires_warm_workers_at_once(tmp_path: Path) -> None:
    # Pressure from 1% of memory in use on: always, here. The idle time alone would be an hour.
    with serving(tmp_path / "store", keep_warm=3600, memory_pressure=1,
                 linger=0) as server, \
            server.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "x = 41")
        _wait_cold(client, session)
        reply, outputs = execute(client, session, "print(x + 1)")
        assert (reply["path"], text(outputs)) == ("cold", "42\n")

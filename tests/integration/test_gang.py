"""Cells that lease several slots at once (gangs) beside one-slot sessions on a real server:
every request served, none deadlocked, a gang's slots held by it alone, its cell given all its
slots' threads; and counts the host cannot give refused with a typed error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from helpers import execute, open_session, serving, text

from fabric.client import Client
from fabric.errors import RemoteError
from fabric.messages import Execute

# what the cell's lease grants (its threads), and when it ran (a window of wall-clock time)
CELL = ("import os, time\n_began = time.time()\ntime.sleep({sleep})\n"
        "print(os.environ['OMP_NUM_THREADS'], _began, time.time())")


def _notebook(client: Client, session: str, cells: int, gpus: int, sleep: float,
              ran: list[tuple[str, dict, str]]) -> None:
    for _ in range(cells):
        reply, outputs = execute(client, session, CELL.format(sleep=sleep), gpus=gpus)
        ran.append((session, reply, text(outputs)))


def test_a_two_slot_cell_runs_beside_one_slot_sessions(tmp_path: Path) -> None:
    with serving(tmp_path / "store", slots=2, threads=1) as server:
        with server.client() as client:
            big, *small = (open_session(client, tmp_path) for _ in range(3))
        ran: list[tuple[str, dict, str]] = []
        plans = [(big, 3, 2, 0.4), *((name, 4, 1, 0.2) for name in small)]
        clients = [server.client(timeout=120) for _ in plans]
        threads = [threading.Thread(target=_notebook, args=(c, *plan, ran))
                   for c, plan in zip(clients, plans, strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        assert not any(t.is_alive() for t in threads), "a session never got its slots"
        for c in clients:
            c.close()
        assert len(ran) == 3 + 4 + 4  # every request served
        assert all(reply["status"] == "ok" for _, reply, _ in ran)
        windows = {name: [] for name in (big, *small)}
        for name, _, printed in ran:
            granted, began, ended = printed.split()
            assert int(granted) == (2 if name == big else 1)  # two slots' worth of threads
            windows[name].append((float(began), float(ended)))
        for began, ended in windows[big]:  # the gang holds both slots: nothing runs beside it
            assert not any(b < ended and began < e for name in small for b, e in windows[name])
        with server.client() as client:
            status = client.call("status")
        assert status["leases"]["held"] == 0 and status["leases"]["queued"] == 0
        assert {s["session"]: s["gpus"] for s in status["sessions"]} == {
            big: 2, small[0]: 1, small[1]: 1}


def test_a_count_the_host_cannot_give_is_refused_and_the_session_goes_on(
        tmp_path: Path) -> None:
    with serving(tmp_path / "store", slots=2, threads=1) as server, server.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "x = 1", gpus=2)  # the session's count: 2 from here on
        for gpus, kind, says in [(3, "slots", "1 to 2 cpu slots on this host, not 3"),
                                 (0, "slots", "not 0"), (True, "protocol", "'gpus'"),
                                 ("2", "protocol", "'gpus'")]:
            with pytest.raises(RemoteError) as refused:
                list(client.start(Execute(session, "x = 2", gpus=gpus)))  # type: ignore[arg-type]
            assert refused.value.kind == kind and says in refused.value.message
        assert server.alive()
        reply, outputs = execute(client, session,
                                 "import os\nprint(x, os.environ['OMP_NUM_THREADS'])")
        assert reply["status"] == "ok" and text(outputs) == "1 2\n"  # nothing ran, 2 kept

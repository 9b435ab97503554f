"""Cells that lease several slots at once (gangs) beside one-slot sessions on a real server:
every request served, none deadlocked, a gang's slots held by it alone, its cell given all its
slots' threads; and counts the host cannot give refused with a typed error."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

import nbformat
import pytest
from attached import Kernel, install_test_kernelspec, kernel_env, text_of
from helpers import execute, open_session, serving, text
from nbformat.v4 import new_code_cell, new_notebook

from fabric.client import Client
from fabric.errors import RemoteError
from fabric.messages import Execute

ROOT = Path(__file__).resolve().parents[2]
THREADS = "import os\nprint('threads', os.environ['OMP_NUM_THREADS'])"

# what the cell's lease grants (its threads), and when it ran (a window of wall-clock time)
CELL = ("import os, time\n_began = time.time()\ntime.sleep({sleep})\n"
        "print(os.environ['OMP_NUM_THREADS'], _began, time.time())")


def _notebook(client: Client, session: str, cells: int, gpus: int, sleep: float,
              ran: list[tuple[str, dict, str]]) -> None:
    for _ in range(cells):
        reply, outputs = execute(client, session, CELL.format(sleep=sleep), gpus=gpus)
        ran.append((session, reply, text(outputs)))


def test_a_two_slot_cell_runs_beside_one_slot_sessions(tmp_path: Path) -> None:
    # linger=0: every lease is back once the cells are done
    with serving(tmp_path / "store", slots=2, threads=1, linger=0) as server:
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
            status = client.status()
        assert status.leases.held == 0 and status.leases.queued == 0
        assert {s.session: s.gpus for s in status.sessions} == {
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


def test_llfabric_run_takes_the_count_from_its_flag_else_the_notebooks_metadata(
        tmp_path: Path) -> None:
    def run(metadata: dict, *flags: str) -> subprocess.CompletedProcess:
        path = tmp_path / f"{uuid.uuid4().hex[:6]}.ipynb"
        nbformat.write(new_notebook(cells=[new_code_cell(THREADS)], metadata=metadata),
                       str(path))
        return subprocess.run([sys.executable, "-m", "cli.main", "run", str(path), "--connect",
                               server.address, *flags], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)

    with serving(tmp_path / "store", slots=2, threads=1) as server:
        assert "threads 2" in run({"llfabric": {"gpus": 2}}).stdout
        assert "threads 1" in run({"llfabric": {"gpus": 2}}, "--gpus", "1").stdout
        bad = run({"llfabric": {"gpus": "two"}})
        assert bad.returncode != 0 and "llfabric.gpus must be a count" in bad.stderr
        assert "1 to 2 cpu slots" in run({}, "--gpus", "3").stderr


def test_the_gpus_magic_sets_the_attached_sessions_count(tmp_path: Path) -> None:
    specs = install_test_kernelspec(tmp_path / "jupyter")
    with serving(tmp_path / "store", slots=2, threads=1) as server:
        kernel = Kernel.start(specs, kernel_env(server.address, f"k-{uuid.uuid4().hex[:8]}"),
                              tmp_path)
        try:
            assert "threads 1" in text_of(kernel.execute(THREADS)[1])
            told = text_of(kernel.execute("%llfabric gpus 2")[1])
            assert "next cells lease 2 cpu slots together" in told
            assert "threads 2" in text_of(kernel.execute(THREADS)[1])
            refused = text_of(kernel.execute("%llfabric gpus 3")[1], "stderr")
            assert "has 2 cpu slots, not 3; nothing changed" in refused
            assert "leases 2 cpu slots together" in text_of(kernel.execute("%llfabric")[1])
            _, outputs = kernel.execute("%llfabric gpus two")
            assert "a count of 1 or more, not 'two'" in text_of(outputs, "stderr")
            assert "threads 2" in text_of(kernel.execute(THREADS)[1])
        finally:
            kernel.stop()

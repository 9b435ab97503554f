"""Clients against a real server, as `llfabric run` processes: Ctrl-C interrupts a cell (twice
detaches from it), `llfabric stop` stops a cell no client follows, a client sharing a session
never closes another's running cell, a server that goes away is reported, not waited on, and a
flood of output leaves the server's and the client's memory flat."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import nbformat
import psutil
import pytest
from helpers import (
    RunningServer,
    execute,
    execute_in_thread,
    open_session,
    serving,
    start_server,
    text,
    wait_until,
)
from nbformat.v4 import new_code_cell, new_notebook

from fabric.client import Client
from fabric.output_limit import OUTPUT_LIMIT

ROOT = Path(__file__).resolve().parents[2]
LLFABRIC = [sys.executable, "-m", "cli.main"]
# runs until stopped; `started` appears in its working directory
FOREVER = "import time\nopen('started', 'w').close()\nwhile True:\n    time.sleep(0.05)\n"
# runs until `go` appears beside it, then sets `done`
WAITING = ("import os, time\nopen('started', 'w').close()\nwhile not os.path.exists('go'):\n"
           "    time.sleep(0.05)\ndone = 'yes'\n")
# an interrupt does not end it: it notes each in `interrupted`
STUBBORN = ("import time\nopen('started', 'w').close()\nwhile True:\n    try:\n"
            "        time.sleep(0.05)\n    except KeyboardInterrupt:\n"
            "        open('interrupted', 'w').close()\n")


# an interrupt escalates to a kill only after a minute: what stops a stubborn cell here is
# the client's doing
CLIENTS = {"keep_warm": 0, "slots": 2, "heartbeat": 1, "heartbeat_timeout": 2,
           "interrupt_grace": 60}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), **CLIENTS) as running:
        yield running


def _notebook(folder: Path, *sources: str) -> Path:
    path = folder / f"nb-{len(list(folder.glob('nb-*')))}.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), str(path))
    return path


def _run(address: str, notebook: Path, session: str) -> subprocess.Popen:
    """`llfabric run` in a process of its own, its output captured."""
    return subprocess.Popen([*LLFABRIC, "run", str(notebook), "--connect", address,
                             "--session", session, "--cwd", str(notebook.parent)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cli(address: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LLFABRIC, *args, "--connect", address], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _running(client: Client, name: str) -> bool:
    return any(s.session == name and s.running for s in client.status().sessions)


def test_ctrl_c_interrupts_the_cell_and_frees_its_slot(server, client, tmp_path) -> None:
    name = f"int-{tmp_path.name[-8:]}"
    process = _run(server.address, _notebook(tmp_path, FOREVER, "never = 1"), name)
    wait_until((tmp_path / "started").exists, "the cell started")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1
    assert "interrupting the cell" in err and "KeyboardInterrupt" in err
    # the run ended with the interrupted cell and closed its session: nothing holds a slot
    assert all(s.session != name for s in client.status().sessions)
    assert client.status().leases.held == 0


def test_a_second_ctrl_c_detaches_and_stop_ends_the_cell(server, client, tmp_path) -> None:
    name = f"det-{tmp_path.name[-8:]}"
    process = _run(server.address, _notebook(tmp_path, STUBBORN), name)
    wait_until((tmp_path / "started").exists, "the cell started")
    process.send_signal(signal.SIGINT)
    wait_until((tmp_path / "interrupted").exists, "the cell was interrupted")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130
    assert f"llfabric stop {name}" in err and f"llfabric follow {name}" in err
    assert _running(client, name)  # detached: it runs on

    stopped = _cli(server.address, "stop", name)
    assert stopped.returncode == 0 and "stopped the cell" in stopped.stderr
    assert not _running(client, name)  # over once stop answers: its slot is back
    assert client.status().leases.held == 0
    assert execute(client, name, "1 + 1")[0]["status"] == "ok"  # the session takes cells
    assert "runs no cell" in _cli(server.address, "stop", name).stderr


def test_a_client_refused_a_cell_leaves_anothers_running_cell_alone(server, client,
                                                                     tmp_path) -> None:
    name = open_session(client, tmp_path)
    thread, result = execute_in_thread(server, name, WAITING)
    wait_until((tmp_path / "started").exists, "the long cell started")
    second = _run(server.address, _notebook(tmp_path, "print('short')"), name)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 1 and "already running" in err
    assert "running another client's cell" in err  # its close was refused
    (tmp_path / "go").touch()
    thread.join(120)
    assert "error" not in result, result.get("error")
    assert result["reply"]["status"] == "ok"  # it ran to its end and committed
    assert text(execute(client, name, "print(done)")[1]) == "yes\n"


def test_a_run_whose_server_dies_mid_cell_reports_it_within_seconds(tmp_path) -> None:
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:
        dying = start_server(tmp_path / "store", Path(sockdir))
        try:
            process = _run(dying.address, _notebook(tmp_path, FOREVER), "dies")
            wait_until((tmp_path / "started").exists, "the cell started")
            os.killpg(dying.process.pid, signal.SIGKILL)  # the server and its workers
            dying.process.wait()
            _, err = process.communicate(timeout=60)
        finally:
            dying.stop()
    assert process.returncode == 1
    assert "went away before it answered" in err


class _PeakRss:
    """The largest resident set of each of some processes, sampled until `stop`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.start = {name: p.memory_info().rss for name, p in self.processes.items()}
        self.peak = dict(self.start)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            for name, process in self.processes.items():
                with contextlib.suppress(psutil.Error):  # a client that has exited
                    self.peak[name] = max(self.peak[name], process.memory_info().rss)

    def growth(self) -> dict[str, int]:
        self._done.set()
        self._thread.join()
        return {name: self.peak[name] - self.start[name] for name in self.processes}


def _peak_run(server: RunningServer, notebook: Path, written: Path) -> tuple[dict, str]:
    """`llfabric run` of `notebook`, its executed copy in `written`: how much the server's and
    the client's resident sets grew at their peak, and what it printed on stderr."""
    process = subprocess.Popen([*LLFABRIC, "run", str(notebook), "--connect", server.address,
                                "--output", str(written)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rss = _PeakRss({"server": server.process.pid, "client": process.pid})
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return rss.growth(), err


def test_an_output_flood_keeps_memory_flat_and_the_rest_summarised(server, tmp_path) -> None:
    check_flood(server, tmp_path, 128)


def check_flood(server: RunningServer, folder: Path, mib: int) -> None:
    """`llfabric run` of a cell writing `mib` MiB as 1 KiB lines, then `mib` MiB in one write:
    neither the server's nor the client's memory grows by half of it, and the notebook keeps
    the first of the output up to the limit, then a summary."""
    flood = 2 * mib << 20  # bytes
    cell = (f"import sys\nline = 'x' * 1023\nfor _ in range({mib} * 1024):\n    print(line)\n"
            f"sys.stdout.write('y' * ({mib} << 20))\n")
    quiet, _ = _peak_run(server, _notebook(folder, "print('hi')"), folder / "quiet.ipynb")
    written = folder / "out.ipynb"
    growth, _ = _peak_run(server, _notebook(folder, cell), written)
    # a client's own start (its imports) is no part of the flood's cost
    assert growth["server"] < flood // 2, growth
    assert growth["client"] - quiet["client"] < flood // 2, (growth, quiet)
    outputs = nbformat.read(str(written), as_version=4).cells[0].outputs
    kept = "".join(o["text"] for o in outputs if o["name"] == "stdout")
    assert OUTPUT_LIMIT - 1024 <= len(kept) <= OUTPUT_LIMIT  # the first of it, up to the limit
    assert outputs[-1]["name"] == "stderr" and "output limit reached" in outputs[-1]["text"]

"""Faults a shared server must survive, each against a real server: slots that must come back,
commits that must not be lost, zygotes that die, a second server, a corrupt store."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    RunningServer,
    execute,
    execute_in_thread,
    open_session,
    serving,
    text,
    wait_until,
)

from fabric.client import Client
from fabric.config import Config
from fabric.errors import RemoteError, Unreachable
from fabric.snapshot import Store, history

GRACE = 2
FAULTS = {"keep_warm": 0, "slots": 2, "interrupt_grace": GRACE, "heartbeat": 1,
          "heartbeat_timeout": 2, "detached_grace": 0}

# a cell that swallows every KeyboardInterrupt: only a kill ends it; it touches `started` (in
# the session's directory) once an interrupt can no longer escape it
STUBBORN = """import time
while True:
    try:
        open({started!r}, 'w').close()
        time.sleep(0.05)
    except KeyboardInterrupt:
        pass
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), **FAULTS) as running:
        yield running


def _started(path: Path) -> None:
    wait_until(path.exists, f"the cell that makes {path.name}")


def _held(client: Client) -> int:
    return client.status().leases.held


def test_interrupt_swallowing_cells_give_their_slots_back(server, client, tmp_path) -> None:
    stubborn = [open_session(client, tmp_path) for _ in range(2)]
    execute(client, stubborn[0], "kept = 'committed'")
    runs = [execute_in_thread(server, name, STUBBORN.format(started=name)) for name in stubborn]
    for name in stubborn:
        _started(tmp_path / name)
    third = open_session(client, tmp_path)
    waiting, result = execute_in_thread(server, third, "print('third ran')")
    wait_until(lambda: client.status().leases.queued == 1, "the third cell queued")
    for name in stubborn:
        assert client.call("interrupt", session=name).interrupted
    waiting.join(60)
    assert text(result["outputs"]) == "third ran\n"  # it got a slot the grace freed
    for thread, run in runs:
        thread.join(30)
        assert run["error"].kind == "stopped"
        assert f"within {GRACE} s of its interrupt" in run["error"].message
        assert run["error"].fields["version"] in (0, 1)
    assert text(execute(client, stubborn[0], "kept")[1]) == "'committed'\n"


def test_an_interrupt_honoured_in_time_is_not_escalated(server, client, tmp_path) -> None:
    name = open_session(client, tmp_path)
    thread, run = execute_in_thread(server, name, "import time\ntry:\n"
                                                  "    open('started', 'w').close()\n"
                                                  "    time.sleep(60)\n"
                                                  "except KeyboardInterrupt:\n    time.sleep(0.1)\n"
                                                  "    done = 'cleanly'\n")
    _started(tmp_path / "started")
    client.call("interrupt", session=name)
    thread.join(30)
    assert run["reply"]["status"] == "ok"
    time.sleep(GRACE + 0.5)  # past the grace: nothing was killed later on
    assert text(execute(client, name, "done")[1]) == "'cleanly'\n"


def test_stop_ends_the_running_cell_and_a_reopen_loses_nothing(server, client,
                                                                  tmp_path) -> None:
    name = open_session(client, tmp_path)
    execute(client, name, "x = 1")
    thread, slow = execute_in_thread(server, name, "import time\ntime.sleep(30)\ny = 'slow'")
    wait_until(lambda: _held(client) >= 1, "the slow cell started")
    # another client's running cell is stopped by `stop`, never by a close (that is refused)
    client.call("stop", session=name)
    thread.join(30)
    assert slow["error"].kind == "stopped"
    client.call("close", session=name)
    client.call("open", session=name, cwd=str(tmp_path))
    execute(client, name, "z = 3")
    assert text(execute(client, name, "print(x, z, 'y' in dir())")[1]) == "1 3 False\n"
    versions = history.log(Store(server.store), name)
    # the stopped cell committed nothing: no version names `y`, and the head holds x and z
    assert all("y" not in g.names for _, m in versions for g in m.groups)
    assert {n for g in versions[0][1].groups for n in g.names} == {"x", "z"}


def test_a_commit_on_a_head_moved_meanwhile_is_refused(server, client, tmp_path) -> None:
    name = open_session(client, tmp_path)
    execute(client, name, "x = 'first'")
    execute(client, name, "x = 'second'")
    flag = tmp_path / "go"
    thread, slow = execute_in_thread(server, name, (
        f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\n"
        "x = 'slow'"))
    wait_until(lambda: _held(client) >= 1, "the slow cell started")
    store = Store(server.store)
    moved = history.checkout(store, name, 1)  # another hand moves the head while it runs
    flag.touch()
    thread.join(30)
    assert slow["error"].kind == "stale"
    assert store.head(name) == history.log(store, name)[0][0]
    assert history.log(store, name)[0][1] == moved  # nothing was written over it
    assert text(execute(client, name, "x")[1]) == "'first'\n"


def test_a_client_that_stops_answering_has_its_cell_stopped(server, client, tmp_path) -> None:
    """With detached_grace = 0 (this module's server), at once; see test_detached for the
    grace a cell gets by default."""
    name = open_session(client, tmp_path)
    script = (f"from helpers import execute\nfrom fabric.client import Client\n"
              f"execute(Client({server.address!r}), {name!r}, "
              f"{STUBBORN.format(started='started')!r})\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    frozen = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        _started(tmp_path / "started")
        os.kill(frozen.pid, signal.SIGSTOP)  # alive, connected, but silent
        wait_until(lambda: _held(client) == 0, "its slot came back", timeout=30)
    finally:
        frozen.kill()
        frozen.wait()
    assert execute(client, name, "1 + 1")[0]["status"] == "ok"


def test_a_second_server_on_the_same_store_or_socket_is_refused(server, client,
                                                                 tmp_path) -> None:
    pid = client.status().pid
    socket = Path(server.address[len("ipc://"):])
    for store, sockdir in ((server.store, tmp_path), (tmp_path / "other", socket.parent)):
        second = start_server_refused(store, sockdir)
        assert f"in use by the llfabric server with pid {pid} serving {server.address}" in second
    assert socket.exists() and client.ping() and server.alive()


def start_server_refused(store: Path, sockdir: Path) -> str:
    """Start a server that must refuse to start; return what it said."""
    config = Config(store=store, runtime_dir=sockdir, bind=f"ipc://{sockdir}/s.sock")
    second = RunningServer(config)
    before = second.log.read_text() if second.log.exists() else ""
    with contextlib.suppress(Unreachable):  # on the same socket, the first answers its ping
        second.start()
    assert second.process.wait(60) != 0
    return second.log.read_text()[len(before):]


def test_the_base_zygote_comes_back_and_cells_run_meanwhile(server, client, tmp_path) -> None:
    names = [open_session(client, tmp_path) for _ in range(2)]
    for name in names:
        execute(client, name, "v = 1")
    base = next(z.pid for z in client.status().zygotes if not z.modules)
    os.kill(base, signal.SIGKILL)
    sources = []
    for name in names:
        reply, outputs = execute(client, name, "v += 1\nprint(v)")
        assert reply["status"] == "ok" and text(outputs) == "2\n"
        sources.append(reply["source"])
    assert sources[0] == "cold"  # at once, while the new base zygote still imports

    def rebuilt() -> bool:
        pids = [z.pid for z in client.status().zygotes if not z.modules]
        return bool(pids) and pids[0] != base
    wait_until(rebuilt, "a new base zygote")
    assert not Path(f"/proc/{base}").exists()  # reaped, not a zombie
    assert execute(client, names[0], "import json\nprint(v)")[0]["status"] == "ok"


def test_a_dead_family_zygote_is_rebuilt(server, client, tmp_path) -> None:
    name = open_session(client, tmp_path)
    execute(client, name, "import numpy as np\na = np.arange(3)")
    family = next(z.pid for z in client.status().zygotes if "numpy" in z.modules)
    os.kill(family, signal.SIGKILL)
    wait_until(lambda: all(z.pid != family for z in client.status().zygotes),
           "the dead zygote dropped")
    assert text(execute(client, name, "print(a.sum())")[1]) == "3\n"
    assert any("numpy" in z.modules for z in client.status().zygotes)


def test_a_fresh_worker_that_dies_before_its_cell_began_is_replaced_once(
        server, client, tmp_path) -> None:
    # the first load of `v` ends its worker, as a killer from outside would; the second loads
    name = open_session(client, tmp_path)
    execute(client, name, "import os\nclass Once:\n    def __setstate__(self, state):\n"
                          "        if not os.path.exists('died'):\n"
                          "            open('died', 'w').close()\n            os._exit(9)\n"
                          "        self.__dict__.update(state)\n"
                          "v = Once()\nv.x = 7\n")
    reply, outputs = execute(client, name, "print(v.x)")
    assert (tmp_path / "died").exists()  # the cell's first worker died loading it
    assert reply["status"] == "ok" and text(outputs) == "7\n"
    assert "died before the cell began" in server.log.read_text()



def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def test_a_recomputed_value_repairs_its_corrupt_chunk(server, client, tmp_path) -> None:
    name = open_session(client, tmp_path)
    execute(client, name, "import numpy as np\na = np.arange(1_000_000)")
    store = Store(server.store)
    blob = history.log(store, name)[0][1].variables()["a"].blob
    [chunk] = store.object_chunks(blob)
    _flip(store.disk.path(chunk))
    with pytest.raises(RemoteError) as err:
        execute(client, name, "a.sum()")
    assert "corrupt" in err.value.message
    execute(client, name, "a = np.arange(1_000_000)")  # the same bytes again: rewritten
    assert text(execute(client, name, "print(a.sum())")[1]) == "499999500000\n"
    assert not [p for p in history.verify(store).problems if chunk in p]


def test_no_commit_on_a_corrupt_head_and_the_others_go_on(server, client, tmp_path) -> None:
    damaged, other = open_session(client, tmp_path), open_session(client, tmp_path)
    execute(client, damaged, "x = 1")
    execute(client, damaged, "x = 2")
    execute(client, other, "y = 'other'")
    store = Store(server.store)
    head = store.head(damaged)
    _flip(server.store / "manifests" / head)
    with pytest.raises(RemoteError) as err:
        execute(client, damaged, "x = 3")
    assert err.value.kind == "store" and "damaged" in err.value.message
    assert store.head(damaged) == head  # nothing was built on it
    assert [m.version for _, m in history.log(store, other)] == [1]
    collected = history.gc(store, grace=3600)
    assert damaged in collected.damaged and other not in collected.damaged
    assert text(execute(client, other, "y")[1]) == "'other'\n"

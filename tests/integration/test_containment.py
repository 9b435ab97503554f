"""The processes a cell starts are its worker's: killed when its cell is stopped, when it is
retired or closed, when the server stops or is killed outright; limited per worker (memory)
and per user (processes); a forked copy of the worker leaves when its cell's code ends."""

from __future__ import annotations

import ast
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import (
    RunningServer,
    execute,
    keyed_serving,
    open_session,
    require_criu,
    serving,
    start_server,
    text,
    wait_until,
)

from fabric.auth import ClientKey, Keys, write_client_key
from fabric.client import Client
from fabric.errors import RemoteError
from fabric.pool.contain import hierarchies

pytestmark = pytest.mark.timeout(180)

# Children of every kind: plain ones, one in a session of its own (out of the worker's process
# group) and a double-forked one (an orphan, out of the worker's tree). Prints their pids once
# each is seen running, so a test that cannot see them alive (its worker retired) still knows.
SPAWN = """import os, subprocess
plain = [subprocess.Popen(["sleep", "6001"]).pid for _ in range(3)]
own = subprocess.Popen(["sleep", "6001"], start_new_session=True).pid
orphan = int(subprocess.run(["sh", "-c", "sleep 6001 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True).stdout)
for pid in (pids := [*plain, own, orphan]):
    os.kill(pid, 0)
print(pids)
"""
MEMORY = 256 << 20
PIDS = 48
LIMITED = {"interrupt_grace": 1, "worker_memory": MEMORY, "user_pids": PIDS}
_admitted: dict[str, ClientKey] = {}  # the module's server's users, by name


def _children(outputs: list[dict], outlive_the_cell: bool = True) -> list[int]:
    pids = ast.literal_eval(text(outputs).strip().splitlines()[-1])
    assert not outlive_the_cell or all(_alive(pid) for pid in pids)
    return pids


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _all_gone(pids: list[int], when: str) -> None:
    wait_until(lambda: not any(_alive(pid) for pid in pids), f"the cell's children killed {when}",
               timeout=30)


def _contained() -> None:
    if os.geteuid() != 0 or not hierarchies():
        pytest.skip("no cgroup can be made here")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    root = tmp_path_factory.mktemp("keys")
    keys = Keys(root)
    write_client_key(root / "client.key", keys.new_client("alice"))  # the readiness ping's
    return keys


@pytest.fixture(scope="module")
def server(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    _contained()
    with keyed_serving(tmp_path_factory.mktemp("store"), keys.root, **LIMITED) as running:
        yield running


def _user(server: RunningServer, keys: Keys, name: str) -> Client:
    """A client of user `name`, admitted at its first."""
    if name not in _admitted:
        _admitted[name] = keys.new_client(name)
    return Client(server.address, timeout=30, key=_admitted[name])


def _in_thread(client: Client, session: str, source: str) -> tuple[threading.Thread, dict]:
    """Run a cell on `client` from a thread; `reply` and `outputs`, or `error`, land in the
    dict."""
    result: dict = {}

    def run() -> None:
        try:
            result["reply"], result["outputs"] = execute(client, session, source)
        except RemoteError as exc:
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_closing_a_session_kills_what_its_cells_started(server, keys, tmp_path) -> None:
    with _user(server, keys, "ann") as ann:
        name = open_session(ann, tmp_path)
        pids = _children(execute(ann, name, SPAWN)[1])
        assert execute(ann, name, "print(1)")[0]["path"] == "warm"  # its worker kept
        assert all(_alive(pid) for pid in pids)
        ann.call("close", session=name)
    _all_gone(pids, "on close")


def test_stopping_a_cell_that_swallows_its_interrupt_kills_its_children(server, keys,
                                                                         tmp_path) -> None:
    with _user(server, keys, "ben") as ben, _user(server, keys, "ben") as runner:
        name = open_session(ben, tmp_path)
        stubborn = SPAWN + ("import time\nopen('started', 'w').close()\nwhile True:\n"
                            "    try:\n        time.sleep(1)\n    except KeyboardInterrupt:\n"
                            "        pass\n")
        thread, run = _in_thread(runner, name, stubborn)
        wait_until((tmp_path / "started").exists, "the stubborn cell started")
        status = next(s for s in ben.status().sessions if s.session == name)
        pids = [p.pid for p in psutil.Process(status.worker).children(recursive=True)]
        assert len(pids) >= 4
        assert ben.call("interrupt", session=name).interrupted
        thread.join(60)
    assert run["error"].kind == "stopped"
    _all_gone(pids, "once the interrupt escalated")


def test_a_user_at_the_pids_limit_stops_there_and_others_go_on(server, keys, tmp_path) -> None:
    with _user(server, keys, "cat") as cat, _user(server, keys, "dan") as dan:
        bomb = open_session(cat, tmp_path)
        other = open_session(dan, tmp_path)
        cell = ("import subprocess, time, os\nprocs = []\ntry:\n    for _ in range(400):\n"
                "        procs.append(subprocess.Popen(['sleep', '6001']))\n"
                "except OSError as exc:\n    print('stopped', type(exc).__name__, flush=True)\n"
                "open('full', 'w').close()\nwhile not os.path.exists('go'):\n"
                "    time.sleep(0.05)\nfor p in procs:\n    p.kill()\n    p.wait()\n"
                "print(len(procs) < 400)\ndel procs\n")
        thread, result = _in_thread(cat, bomb, cell)
        wait_until((tmp_path / "full").exists, "the fork bomb filled its user's pids")
        # another user's fresh worker forks and runs meanwhile
        assert text(execute(dan, other, "import subprocess\n"
                                        "print(subprocess.run(['echo', 'fine'], "
                                        "capture_output=True, text=True).stdout)")[1]) \
            == "fine\n\n"
        (tmp_path / "go").touch()
        thread.join(60)
    assert "error" not in result, result
    assert text(result["outputs"]) == "stopped BlockingIOError\nTrue\n"


def test_a_cell_past_worker_memory_is_told_it_ran_out_of_memory(server, keys, tmp_path) -> None:
    with _user(server, keys, "eve") as eve:
        name = open_session(eve, tmp_path)
        execute(eve, name, "kept = 1")
        with pytest.raises(RemoteError) as failed:
            execute(eve, name, f"hog = b'x' * {2 * MEMORY}")
        assert "ran out of memory" in failed.value.message
        assert "worker_memory" in failed.value.message
        assert text(execute(eve, name, "print(kept)")[1]) == "1\n"


def test_a_forked_copy_of_the_worker_leaves_when_its_cell_ends(server, keys, tmp_path) -> None:
    with _user(server, keys, "fay") as fay:
        name = open_session(fay, tmp_path)
        execute(fay, name, "import os\npid = os.fork()\nif pid == 0:\n"
                           "    print('in the child')\n    display('a display in the child')\n"
                           "    x = 1 / 0\n")
        waited = ("import time\nfor _ in range(600):\n"
                  "    done, status = os.waitpid(pid, os.WNOHANG)\n"
                  "    if done:\n        break\n    time.sleep(0.05)\n"
                  "print(done == pid, os.waitstatus_to_exitcode(status))")
        outputs = execute(fay, name, waited)[1]
        # the child's cell failed (its traceback on stderr, whenever it came), and it left
        assert "".join(o["text"] for o in outputs if o.get("name") == "stdout") == "True 1\n"
        assert text(execute(fay, name, "print(pid > 0)")[1]) == "True\n"


def test_a_retired_worker_leaves_no_process_behind(tmp_path: Path) -> None:
    _contained()
    with serving(tmp_path / "store", keep_warm=0) as server, server.client() as client:
        name = open_session(client, tmp_path)
        # keep_warm=0: the worker may retire, and its children die, before the reply is read
        pids = _children(execute(client, name, SPAWN)[1], outlive_the_cell=False)
        _all_gone(pids, "when the worker retired after its cell")


@pytest.mark.parametrize("how", ["terminated", "killed"])
def test_a_stopped_server_leaves_no_process_behind(tmp_path: Path, how: str) -> None:
    _contained()
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:
        server = start_server(tmp_path / "store", Path(sockdir))
        try:
            with server.client() as client:
                name = open_session(client, tmp_path)
                pids = _children(execute(client, name, SPAWN)[1])
            if how == "terminated":
                server.stop()
                assert server.process.returncode == 0
            else:
                server.process.kill()  # the warden takes over
                server.process.wait()
        finally:
            server.stop()
    _all_gone(pids, f"once the server was {how}")


@pytest.mark.parametrize("source", ["template", "cool"])
def test_a_restored_workers_children_are_killed_with_it(tmp_path: Path, source: str) -> None:
    _contained()
    require_criu(f"a {source} worker")
    settings = {"worker_source": "template"} if source == "template" else {"cool_after": 1}
    with serving(tmp_path / "store", **settings) as server, server.client() as client:
        name = open_session(client, tmp_path)
        if source == "template":
            execute(client, name, "pass")
            wait_until(lambda: any(t.state == "ready"
                                   for t in client.status().templates),
                       "the template built")
            client.call("close", session=name)
            client.call("open", session=name, cwd=str(tmp_path))
        if source == "template":
            reply, _ = execute(client, name, SPAWN)
            # in its own PID namespace: the pids its cell printed are not this one's
            worker = next(s for s in client.status().sessions
                          if s.session == name).worker
            init = psutil.Process(worker).parent()
            pids = [p.pid for p in init.children(recursive=True) if p.pid != worker]
            assert len(pids) >= 5
        else:
            execute(client, name, "g = (i for i in range(3))")  # pinned: cooled, not retired
            wait_until(lambda: next(s for s in client.status().sessions
                                    if s.session == name).tier == "cool", "cooled")
            reply, _ = execute(client, name, "next(g)\n" + SPAWN)
            # restored in a PID namespace of its own, under its init (`worker`): the pids its
            # cell printed are not this one's
            worker = next(s for s in client.status().sessions if s.session == name).worker
            pids = [p.pid for p in psutil.Process(worker).children(recursive=True)
                    if p.name() == "sleep"]
            assert len(pids) == 5
        assert reply["source"] == source
        client.call("close", session=name)
    _all_gone(pids, f"with a {source} worker")

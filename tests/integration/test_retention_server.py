"""A bounded store on a real server: retention and gc run in it while cells commit, named
versions and the head survive, thinned versions are refused, sessions can be removed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import execute, execute_in_thread, open_session, pid_of_running_cell, serving

from fabric.errors import RemoteError
from fabric.snapshot import Store, history
from fabric.status import UpkeepStatus

MODEL = """import numpy as np
w = np.random.default_rng(0).standard_normal({n}, dtype=np.float32)
"""
STEP = "w += np.float32(0.001) * np.sign(w)  # a training step: every weight changes"


def _disk(store: Path) -> int:
    return sum(p.stat().st_size for p in (store / "blobs").rglob("*") if p.is_file())


def _wait_for_upkeep(server, since: float) -> UpkeepStatus:
    with server.client() as client:
        for _ in range(600):
            upkeep = client.status().upkeep
            if upkeep is not None and upkeep.time > since:
                return upkeep
            time.sleep(0.1)
    raise AssertionError("the server ran no retention pass")


def _train(tmp_path: Path, store: Path, cells: int, floats: int, last: int) -> None:
    """`cells` training steps on a model of `floats` float32 weights, with the server's
    retention and gc running every second meanwhile; then check what the policy implies."""
    state = floats * 4
    with serving(store, keep_warm=0, keep_versions=last, gc_interval=1) as server, \
            server.client(timeout=300) as client:
        name = open_session(client, tmp_path)
        assert execute(client, name, MODEL.format(n=floats))[0]["status"] == "ok"
        client.call("tag", session=name, name="init")
        for i in range(cells):
            assert execute(client, name, STEP)[0]["status"] == "ok"
            if i == cells // 2:
                client.call("tag", session=name, name="half")
        done = time.time()
        # a pass keeps what was written in the second before it began (a save in flight may
        # name it): one that begins after that has freed what the policy releases
        upkeep = _wait_for_upkeep(server, done + 1.5)
        assert upkeep.thinned >= 0 and upkeep.disk_percent >= 0
        # the bound the policy implies: the newest `last`, the named two, and the newest of
        # this hour and of this day (at most two more), each a whole copy of the state
        assert _disk(store) <= (last + 2 + 2) * state * 1.05 + (1 << 20)
        versions = history.log(Store(store), name)
        assert len(versions) == cells + 1  # every cell's manifest stays: a tombstone
        checked = history.verify(Store(store))
        assert not checked.problems  # nothing committed and kept went missing under gc
        assert checked.held[name] <= (last + 4) * state * 1.05 + (1 << 20)
        # the head and the named versions hold their state
        assert execute(client, name, "float(abs(w).sum())")[0]["status"] == "ok"
        client.call("checkout", session=name, version="init")
        out = execute(client, name, "print(int((w == np.random.default_rng(0)"
                                    f".standard_normal({floats}, dtype=np.float32)).all()))")
        assert out[1][0]["text"].strip() == "1"
        with pytest.raises(RemoteError, match=r"thinned away.*these remain: .*\(half\)") as err:
            client.call("checkout", session=name, version=3)
        assert err.value.kind == "store"


def test_fifty_training_cells_stay_under_the_policys_bound(tmp_path: Path) -> None:
    _train(tmp_path, tmp_path / "store", cells=30, floats=1 << 20, last=4)  # 4 MB of state


@pytest.mark.deep
def test_fifty_training_cells_on_a_64_mb_model_stay_bounded(tmp_path: Path) -> None:
    _train(tmp_path, tmp_path / "store", cells=50, floats=16 << 20, last=20)


def test_a_session_is_removed_but_not_while_it_runs_a_cell(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with serving(store, keep_warm=0) as server, server.client() as client:
        name = open_session(client, tmp_path)
        execute(client, name, "import numpy as np\nw = np.ones(1 << 20)")
        thread, result = execute_in_thread(server, name, "import time\ntime.sleep(30)")
        pid_of_running_cell(server, name)
        with pytest.raises(RemoteError, match="running a cell") as err:
            client.call("rm", session=name)
        assert err.value.kind == "busy"
        client.call("interrupt", session=name)
        thread.join(60)
        assert "reply" in result or "error" in result  # the cell is over
        assert client.call("rm", session=name).removed
        assert name not in Store(store).sessions()
        with pytest.raises(RemoteError, match="no open session"):
            client.call("execute", session=name, source="1")
        with pytest.raises(RemoteError, match="no session"):
            client.call("rm", session=name)
    history.gc(Store(store))
    assert _disk(store) < 1 << 20  # its 8 MB went at once, with no grace to wait out


def test_commits_run_retention_at_once_and_disk_pressure_is_told(tmp_path: Path) -> None:
    store = tmp_path / "store"
    # any disk is past 1%; no periodic pass: the commits alone ask for them
    with serving(store, keep_warm=0, keep_versions=1, gc_interval=0, disk_pressure=1) as server, \
            server.client() as client:
        name = open_session(client, tmp_path)
        started = time.time()
        for _ in range(3):
            execute(client, name, MODEL.format(n=1 << 18))
        upkeep = _wait_for_upkeep(server, started)
        assert upkeep.pressure and upkeep.disk_percent >= 1
        assert "full (disk_pressure = 1)" in server.log.read_text()
        for _ in range(300):  # the pass the last commit asked for
            if history.verify(Store(store)).held[name] < 2 << 20:  # one copy of 1 MB, not 3
                break
            time.sleep(0.1)
        else:
            raise AssertionError("retention under pressure left the old versions")

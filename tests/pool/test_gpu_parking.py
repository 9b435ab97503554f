"""Parking a kept worker off the GPU between cells, through a real server and real workers with
the fake CUDA driver: checkpointed after its cell (before its lease ends), restored before the
next; a worker that cannot be parked is retired and the session goes on from the store.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path

import pytest
from fake_cuda import FakeDriver
from helpers import execute, open_session, require_criu, text

from fabric.client import Client
from fabric.config import Config
from fabric.messages import Output
from fabric.pool import Leases
from fabric.pool.cuda import ProcessState
from fabric.pool.gpus import Gpu
from fabric.server import Server
from fabric.snapshot import Store
from fabric.snapshot.commit import CellRecord, Report, commit, head_manifest

GPUS = [Gpu(0, "GPU-00000000-0000-0000-0000-00000000000a", "fake", 1 << 30),
        Gpu(1, "GPU-00000000-0000-0000-0000-00000000000b", "fake", 1 << 30)]


def _with_server(tmp_path: Path, driver: FakeDriver, scenario,
                 cool_after: int = 0, keep_warm: int = 0, gpus: list[Gpu] | None = None) -> None:
    """Run `scenario(client, server)` in a thread against a server in this thread's loop
    (by default keeping a session's worker only while it holds unsaved state), leasing `gpus`
    if given, else CPU slots."""
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:
        config = Config(store=tmp_path / "store", runtime_dir=Path(sockdir),
                        bind=f"ipc://{sockdir}/s.sock", cool_after=cool_after,
                        keep_warm=keep_warm, linger=0)  # parked as soon as its cell is saved

        async def main() -> None:
            server = Server(config)
            server.host.pool.cuda = driver
            if gpus:
                server.host.leases = Leases(devices=gpus)
            ready = asyncio.Event()
            serving = asyncio.ensure_future(server.serve(ready))
            await ready.wait()
            try:
                def talk() -> None:
                    with Client(config.address, timeout=60) as client:
                        scenario(client, server)

                await asyncio.to_thread(talk)
            finally:
                server.stop()
                await serving

        asyncio.run(main())


def test_a_kept_worker_is_checkpointed_between_cells(tmp_path: Path) -> None:
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = open_session(client, tmp_path)
        reply, _ = execute(client, session, "g = (i for i in range(5))\nnext(g)")
        assert reply["unsaved"] == ["g"]
        pid = server.host.sessions[session].prepared.task.result().process
        assert driver.states[pid] is ProcessState.CHECKPOINTED  # off the GPU before the lease ended
        reply, outputs = execute(client, session, "next(g)")
        assert text(outputs) == "1\n" and reply["path"] == "pinned"
        steps = [step for step, p in driver.calls if p == pid and step != "state"]
        assert steps == ["lock", "checkpoint", "restore", "unlock", "lock", "checkpoint"]
        assert driver.states[pid] is ProcessState.CHECKPOINTED

    _with_server(tmp_path, driver, scenario)


def test_processes_a_cell_started_are_parked_and_resumed_with_its_worker(tmp_path: Path) -> None:
    driver = FakeDriver()  # every process holds CUDA state to it: a DDP rank, say

    def scenario(client: Client, server: Server) -> None:
        session = open_session(client, tmp_path)
        reply, _ = execute(client, session, "import subprocess\n"
                           "rank = subprocess.Popen(['sleep', '300'])\n"
                           "g = (i for i in range(5))")
        assert reply["status"] == "ok" and "g" in reply["unsaved"]
        worker = server.host.sessions[session].prepared.task.result()
        pid, child = worker.process, worker.tree()[1]
        assert driver.states[pid] is driver.states[child] is ProcessState.CHECKPOINTED
        reply, outputs = execute(client, session, "print(next(g), rank.poll())")
        assert reply["path"] == "pinned" and text(outputs) == "0 None\n"
        assert [s for s, p in driver.calls if p == child and s != "state"] == \
            ["lock", "checkpoint", "restore", "unlock", "lock", "checkpoint"]
        execute(client, session, "rank.kill()")

    _with_server(tmp_path, driver, scenario)


def _wait_session(client: Client, session: str, check) -> None:
    deadline = time.monotonic() + 60
    while not check(next(s for s in client.status().sessions
                         if s.session == session)):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_worker_that_cannot_be_parked_is_retired_and_the_session_goes_on(
        tmp_path: Path) -> None:
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = open_session(client, tmp_path)
        driver.fail["lock"] = ("CUDA_ERROR_TIMEOUT", None)
        reply, outputs = execute(client, session, "kept = 1\ng = (i for i in range(5))")
        assert reply["status"] == "ok" and reply["unsaved"] == [] and outputs == []
        assert "could not be taken off the GPU" in reply["notices"][-1]["text"]
        reply, outputs = execute(client, session, "print(kept, next(g))")  # g recomputed
        assert reply["path"] == "cold+replay" and text(outputs) == "1 0\n"
        # a value whose cells cannot run again is lost, and the user is told in the cell
        driver.fail["lock"] = ("CUDA_ERROR_TIMEOUT", None)
        reply, outputs = execute(client, session, "h = (i for i in range(5))\n!true")
        assert "could not be taken off the GPU" in text(outputs)
        reply, outputs = execute(client, session, "print(kept)\nh")
        assert reply["path"] == "cold"
        assert text(outputs).startswith("1\nNameError")

    _with_server(tmp_path, driver, scenario)


def test_a_worker_that_cannot_be_resumed_is_replaced_and_its_values_recomputed(
        tmp_path: Path) -> None:
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = open_session(client, tmp_path)
        execute(client, session, "kept = 1\ng = (i for i in range(5))")
        driver.fail["restore"] = ("CUDA_ERROR_OUT_OF_MEMORY", ProcessState.FAILED)
        reply, outputs = execute(client, session, "next(g)")  # on a fresh worker: recomputed
        assert reply["path"] == "cold+replay" and text(outputs) == "0\n"
        reply, outputs = execute(client, session, "print(kept)")
        assert reply["status"] == "ok" and text(outputs) == "1\n"

    _with_server(tmp_path, driver, scenario)


def test_a_kept_worker_cooled_with_a_load_held_back_loads_it_when_it_comes_back(
        tmp_path: Path) -> None:
    require_criu("cool workers")
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = open_session(client, tmp_path)
        execute(client, session, "early = 41")
        reply, _ = execute(client, session, "g = (i for i in range(5))")  # loads no `early`
        assert reply["unsaved"] == ["g"]
        cell = "print(early + 1, next(g))"
        client.call("draft", session=session, source=cell)  # parked: its load waits
        _wait_session(client, session, lambda status: status.tier == "cool")
        reply, outputs = execute(client, session, cell)
        assert (reply["path"], text(outputs)) == ("pinned", "42 0\n")

    _with_server(tmp_path, driver, scenario, cool_after=1)


PROBE = (  # an object that says when, and with which GPUs visible, it is unpickled
    "import os\nclass Probe:\n    def __setstate__(self, state):\n"
    "        open(state['path'], 'a').write(os.environ.get('CUDA_VISIBLE_DEVICES', 'none'))\n"
    "        self.__dict__.update(state)\np = Probe()\np.path = {path!r}")


def _drafted(client: Client, session: str, cell: str) -> None:
    client.call("draft", session=session, source=cell)
    _wait_session(client, session, lambda status: status.worker)
    time.sleep(1)  # time enough for a load that goes ahead of the lease


def test_a_prepared_worker_on_a_gpu_host_loads_host_state_before_the_lease(
        tmp_path: Path) -> None:
    probe = tmp_path / "unpickled"
    cell = "print(open(p.path).read())"

    def scenario(client: Client, server: Server) -> None:
        session = open_session(client, tmp_path)
        execute(client, session, PROBE.format(path=str(probe)))
        _drafted(client, session, cell)
        assert probe.read_text() == "none"  # prepared while the user edits, no GPU needed
        reply, outputs = execute(client, session, cell)
        assert (reply["path"], text(outputs)) == ("draft", "none\n")

    _with_server(tmp_path, FakeDriver(), scenario, gpus=GPUS)


def test_a_group_holding_cuda_memory_loads_only_under_the_lease_on_the_leased_gpu(
        tmp_path: Path) -> None:
    """Unpickled before the lease, a CUDA tensor would make a CUDA context on a GPU that no lease
    grants: its group waits, and then sees only the leased GPU."""
    probe, sessions = tmp_path / "unpickled", []
    cell = "print(open(p.path).read())"
    _with_server(tmp_path, FakeDriver(), lambda client, _: sessions.append(
        _run_probe(client, tmp_path, PROBE.format(path=str(probe)))), gpus=GPUS)
    probe.unlink(missing_ok=True)
    _mark_on_gpu(Store(tmp_path / "store"), "p")  # as the codec marks a group of CUDA tensors

    def scenario(client: Client, server: Server) -> None:
        client.call("open", session=sessions[0], cwd=str(tmp_path))
        _drafted(client, sessions[0], cell)
        assert not probe.exists()
        reply, outputs = execute(client, sessions[0], cell)
        assert reply["path"] == "draft" and text(outputs) in {f"{g.uuid}\n" for g in GPUS}

    _with_server(tmp_path, FakeDriver(), scenario, gpus=GPUS)


def test_a_replay_loads_the_cuda_memory_it_starts_from_under_the_lease_before_it_runs(
        tmp_path: Path) -> None:
    probe, sessions = tmp_path / "unpickled", []
    _with_server(tmp_path, FakeDriver(), lambda client, _: sessions.append(
        _run_probe(client, tmp_path, PROBE.format(path=str(probe)))), gpus=GPUS)
    _mark_on_gpu(Store(tmp_path / "store"), "p")
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = sessions[0]
        client.call("open", session=session, cwd=str(tmp_path))
        driver.fail["lock"] = ("CUDA_ERROR_TIMEOUT", None)  # its worker is retired after it
        reply, _ = execute(client, session, "g = (p for _ in range(5))")
        assert "could not be taken off the GPU" in reply["notices"][-1]["text"]
        probe.unlink()
        reply, outputs = execute(client, session, "print(next(g).path == p.path)")
        assert (reply["path"], text(outputs)) == ("cold+replay", "True\n")
        assert probe.read_text() in {g.uuid for g in GPUS}  # unpickled once, under the lease

    _with_server(tmp_path, driver, scenario, gpus=GPUS)


def _run_probe(client: Client, cwd: Path, source: str) -> str:
    session = open_session(client, cwd)
    execute(client, session, source)
    return session


def _mark_on_gpu(store: Store, name: str) -> None:
    """A version on the head whose group of `name` holds CUDA memory."""
    (session,) = store.sessions()
    head = store.head(session)
    manifest = head_manifest(store, session, head)
    group = manifest.variables()[name]
    report = Report(groups=[(group.blob, list(group.names), group.size)], kept=[], imports={},
                    refs={n: list(manifest.refs.get(n, ())) for n in group.names},
                    packages={}, ambient=manifest.ambient, owned=list(group.names), unsaved={},
                    devices=[group.blob])
    commit(store, session, head, report, CellRecord(f"{name} = {name}", 2, "ok", 0.0,
                                                    frozenset()))


def test_a_warm_worker_is_parked_after_its_cell_and_resumed_for_the_next(tmp_path: Path) -> None:
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = open_session(client, tmp_path)
        reply, _ = execute(client, session, "x = 41")
        assert reply["unsaved"] == []
        pid = server.host.sessions[session].prepared.task.result().process
        assert driver.states[pid] is ProcessState.CHECKPOINTED  # off the GPU before the lease ended
        # asked first to move its own storages: it has none (no torch), so the driver took all
        (worker,) = [w for w in client.status().workers if w.pid == pid]
        assert (worker.parked, worker.moved, worker.fallback) == (True, 0, None)
        reply, outputs = execute(client, session, "print(x + 1)")
        assert (reply["path"], text(outputs)) == ("warm", "42\n")
        steps = [step for step, p in driver.calls if p == pid and step != "state"]
        assert steps == ["lock", "checkpoint", "restore", "unlock", "lock", "checkpoint"]

    _with_server(tmp_path, driver, scenario, keep_warm=300)


def test_a_warm_worker_that_cannot_be_parked_is_retired_quietly(tmp_path: Path) -> None:
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = open_session(client, tmp_path)
        driver.fail["lock"] = ("CUDA_ERROR_TIMEOUT", None)
        reply, outputs = execute(client, session, "x = 41")
        assert reply["status"] == "ok" and outputs == []  # nothing was lost: nothing to tell
        assert server.host.sessions[session].prepared is None
        reply, outputs = execute(client, session, "print(x + 1)")
        assert (reply["path"], text(outputs)) == ("cold", "42\n")

    _with_server(tmp_path, driver, scenario, keep_warm=300)


def test_a_warm_worker_that_cannot_be_resumed_gives_way_to_a_fresh_one(tmp_path: Path) -> None:
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = open_session(client, tmp_path)
        execute(client, session, "x = 41")
        driver.fail["restore"] = ("CUDA_ERROR_OUT_OF_MEMORY", ProcessState.FAILED)
        reply, outputs = execute(client, session, "print(x + 1)")  # the store had it all
        assert (reply["status"], reply["path"], text(outputs)) == ("ok", "cold", "42\n")

    _with_server(tmp_path, driver, scenario, keep_warm=300)


def _hold_a_gpu(address: str, session: str, flag: Path,
                gpus: int | None = None) -> threading.Thread:
    """Run a cell in `session` (on `gpus` GPUs) that holds its lease until `flag` exists;
    return once it runs."""
    started = threading.Event()

    def run() -> None:
        with Client(address, timeout=60) as client:
            for message in client.execute(session, (
                    f"import os, time\nprint('holding', flush=True)\n"
                    f"while not os.path.exists({str(flag)!r}): time.sleep(0.01)"), gpus=gpus,
                    timeout=60):
                if isinstance(message, Output):
                    started.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(60)
    return thread


def _execute_when_queued(client: Client, address: str, session: str, source: str,
                         release: Path) -> tuple[dict, list[dict]]:
    """Run a cell that must wait for a lease; once it waits, touch `release` (which frees one)."""
    done: dict = {}

    def run() -> None:
        with Client(address, timeout=60) as own:
            done["result"] = execute(own, session, source)

    waiting = threading.Thread(target=run)
    waiting.start()
    deadline = time.monotonic() + 30
    while client.status().leases.queued == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    release.touch()
    waiting.join(60)
    return done["result"]


@pytest.mark.parametrize("can_move", [True, False])
def test_a_parked_worker_moves_to_the_gpu_its_next_lease_is_for(tmp_path: Path,
                                                                can_move: bool) -> None:
    driver = FakeDriver()
    driver.can_move = can_move  # False: as the cuda-checkpoint utility, which has no GPU pairs
    gpu_a, gpu_b = (gpu.uuid for gpu in GPUS)

    def scenario(client: Client, server: Server) -> None:
        address = server.config.address
        mine, first, second = (open_session(client, tmp_path) for _ in range(3))
        holders = [_hold_a_gpu(address, first, tmp_path / "free-a")]  # holds GPU a
        execute(client, mine, "x = 41")  # so this cell runs on GPU b, and parks off it
        pid = server.host.sessions[mine].prepared.task.result().process
        holders.append(_hold_a_gpu(address, second, tmp_path / "free-b"))  # now GPU b too
        try:  # GPU a comes free first: the parked worker moves there
            reply, outputs = _execute_when_queued(client, address, mine, "print(x + 1)",
                                                  tmp_path / "free-a")
        finally:
            (tmp_path / "free-a").touch()
            (tmp_path / "free-b").touch()
            for holder in holders:
                holder.join(60)
        if can_move:
            assert (reply["path"], text(outputs)) == ("warm", "42\n")
            assert driver.moves == [(pid, {gpu_b: gpu_a})]
        else:  # it cannot: the cell starts on a fresh worker from the store
            assert (reply["path"], text(outputs)) == ("cold", "42\n")
            assert driver.moves == []

    _with_server(tmp_path, driver, scenario, keep_warm=300, gpus=GPUS)


def test_a_parked_worker_goes_back_to_its_own_gpu_when_it_is_free(tmp_path: Path) -> None:
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        mine, *others = (open_session(client, tmp_path) for _ in range(3))
        execute(client, mine, "x = 41")  # on GPU a, the first free
        for other in others:  # fresh workers take the GPU least recently used: b, then a
            execute(client, other, "y = 1")
        reply, outputs = execute(client, mine, "print(x + 1)")  # b is now first in line
        assert (reply["path"], text(outputs)) == ("warm", "42\n")
        assert driver.moves == []  # GPU a was free: no move

    _with_server(tmp_path, driver, scenario, keep_warm=300, gpus=GPUS)


def test_a_worker_parked_off_two_gpus_moves_to_two_others_gpu_by_gpu(tmp_path: Path) -> None:
    driver = FakeDriver()
    a, b, c, d = (f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in "abcd")
    four = [Gpu(i, uuid, "fake", 1 << 30) for i, uuid in enumerate((a, b, c, d))]

    def scenario(client: Client, server: Server) -> None:
        address = server.config.address
        mine, first, second = (open_session(client, tmp_path) for _ in range(3))
        holders = [_hold_a_gpu(address, first, tmp_path / "free-1", gpus=2)]  # on a and b
        reply, outputs = execute(client, mine, "import os\nx = 41\n"
                                 "print(os.environ['CUDA_VISIBLE_DEVICES'])", gpus=2)
        assert text(outputs) == f"{c},{d}\n"  # one value, in slot order; parked off c, d
        pid = server.host.sessions[mine].prepared.task.result().process
        holders.append(_hold_a_gpu(address, second, tmp_path / "free-2", gpus=2))  # c and d
        (tmp_path / "free-1").touch()
        holders.pop(0).join(60)
        try:  # a and b are free: the worker's two GPUs' state moves there, in order
            reply, outputs = execute(client, mine, "print(x + 1)")
        finally:
            (tmp_path / "free-2").touch()
            holders[0].join(60)
        assert (reply["path"], text(outputs)) == ("warm", "42\n")
        assert driver.moves == [(pid, {c: a, d: b})]

    _with_server(tmp_path, driver, scenario, keep_warm=300, gpus=four)

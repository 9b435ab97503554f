"""Parking a kept worker off the GPU between cells, through a real server and real workers with
the fake CUDA driver: checkpointed after its cell (before its lease ends), restored before the
next; a worker that cannot be parked is retired and the session goes on from the store.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from fake_cuda import FakeDriver
from helpers import execute, require_criu, text

from fabric.client import Client
from fabric.config import Config
from fabric.errors import RemoteError
from fabric.pool.cuda import State
from fabric.server import Server


def _with_server(tmp_path: Path, driver: FakeDriver, scenario, source: str = "zygote",
                 cool_after: int = 0) -> None:
    """Run `scenario(client, server)` in a thread against a server in this thread's loop."""
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:
        config = Config(store=tmp_path / "store", runtime_dir=Path(sockdir),
                        bind=f"ipc://{sockdir}/s.sock", cool_after=cool_after,
                        worker_source=source)

        async def main() -> None:
            server = Server(config)
            server.pool.cuda = driver
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
        session = f"t-{uuid.uuid4().hex[:8]}"
        client.call("open", session=session, cwd=str(tmp_path))
        reply, _ = execute(client, session, "g = (i for i in range(5))\nnext(g)")
        assert reply["unsaved"] == ["g"]
        pid = server.sessions[session].prepared.task.result().process
        assert driver.states[pid] is State.CHECKPOINTED  # off the GPU before the lease ended
        reply, outputs = execute(client, session, "next(g)")
        assert text(outputs) == "1\n" and reply["path"] == "pinned"
        steps = [step for step, p in driver.calls if p == pid and step != "state"]
        assert steps == ["lock", "checkpoint", "restore", "unlock", "lock", "checkpoint"]
        assert driver.states[pid] is State.CHECKPOINTED

    _with_server(tmp_path, driver, scenario)


def _built_template(client: Client) -> list[dict]:
    """The server's templates once the first build has ended."""
    deadline = time.monotonic() + 60
    while not (built := client.call("status")["templates"]) or built[0]["state"] == "building":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return built


def _wait_session(client: Client, session: str, check) -> None:
    deadline = time.monotonic() + 60
    while not check(next(s for s in client.call("status")["sessions"]
                         if s["session"] == session)):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_worker_that_cannot_be_parked_is_retired_and_the_session_goes_on(
        tmp_path: Path) -> None:
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = f"t-{uuid.uuid4().hex[:8]}"
        client.call("open", session=session, cwd=str(tmp_path))
        driver.fail["lock"] = ("CUDA_ERROR_TIMEOUT", None)
        reply, outputs = execute(client, session, "kept = 1\ng = (i for i in range(5))")
        assert reply["status"] == "ok" and reply["unsaved"] == []
        assert "could not be taken off the GPU" in text(outputs)
        reply, outputs = execute(client, session, "print(kept)\ng")
        assert reply["path"] == "cold"
        assert text(outputs).startswith("1\nNameError")

    _with_server(tmp_path, driver, scenario)


def test_a_worker_that_cannot_be_resumed_fails_its_cell_not_the_session(tmp_path: Path) -> None:
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = f"t-{uuid.uuid4().hex[:8]}"
        client.call("open", session=session, cwd=str(tmp_path))
        execute(client, session, "kept = 1\ng = (i for i in range(5))")
        driver.fail["restore"] = ("CUDA_ERROR_OUT_OF_MEMORY", State.FAILED)
        with pytest.raises(RemoteError) as failed:
            execute(client, session, "next(g)")
        assert failed.value.kind == "worker_died"
        assert "could not be put back on the GPU" in failed.value.message
        reply, outputs = execute(client, session, "print(kept)")
        assert reply["status"] == "ok" and text(outputs) == "1\n"

    _with_server(tmp_path, driver, scenario)


def test_a_template_is_dumped_off_the_gpu_and_its_copies_resume_under_a_lease(
        tmp_path: Path) -> None:
    require_criu("templates")
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = f"t-{uuid.uuid4().hex[:8]}"
        client.call("open", session=session, cwd=str(tmp_path))
        execute(client, session, "x = 1")  # the family's template builds meanwhile
        built = _built_template(client)
        assert built[0]["state"] == "ready" and built[0]["cuda"] is True, built
        dumped = [pid for step, pid in driver.calls if step == "checkpoint"]
        assert len(dumped) == 1  # the dormant worker, checkpointed before its dump
        driver.default = State.CHECKPOINTED  # as every copy comes back
        reply, outputs = execute(client, session, "print(x + 1)")
        assert (reply["source"], text(outputs)) == ("template", "2\n")
        resumed = [pid for step, pid in driver.calls if step in ("restore", "unlock")]
        assert len(set(resumed)) == 1 and resumed[0] != dumped[0]  # the copy, not the original
        assert driver.states[resumed[0]] is State.RUNNING

    _with_server(tmp_path, driver, scenario, source="template")


def test_a_parked_copy_loads_the_session_state_only_under_its_lease(tmp_path: Path) -> None:
    """Unpickling a CUDA tensor (or seeding torch's CUDA RNG) in a copy whose CUDA state is
    still checkpointed would block in the driver: the copy is prepared, its load waits."""
    require_criu("templates")
    driver = FakeDriver()
    probe = tmp_path / "unpickled"
    cell = "print(open(p.path).read())"

    def scenario(client: Client, server: Server) -> None:
        session = f"t-{uuid.uuid4().hex[:8]}"
        client.call("open", session=session, cwd=str(tmp_path))
        execute(client, session, (  # an object that says when it is unpickled
            "class Probe:\n    def __setstate__(self, state):\n"
            "        open(state['path'], 'a').write('loaded\\n')\n"
            f"        self.__dict__.update(state)\np = Probe()\np.path = {str(probe)!r}"))
        assert _built_template(client)[0]["state"] == "ready"
        driver.default = State.CHECKPOINTED  # as every copy comes back
        client.call("draft", session=session, source=cell)
        _wait_session(client, session, lambda status: status["worker"])
        assert not probe.exists()  # restored and woken, but nothing loaded while parked
        reply, outputs = execute(client, session, cell)
        assert (reply["path"], reply["source"]) == ("draft", "template")
        assert text(outputs) == "loaded\n\n"

    _with_server(tmp_path, driver, scenario, source="template")


def test_a_kept_worker_cooled_with_a_load_held_back_loads_it_when_it_comes_back(
        tmp_path: Path) -> None:
    require_criu("cool workers")
    driver = FakeDriver()

    def scenario(client: Client, server: Server) -> None:
        session = f"t-{uuid.uuid4().hex[:8]}"
        client.call("open", session=session, cwd=str(tmp_path))
        execute(client, session, "early = 41")
        reply, _ = execute(client, session, "g = (i for i in range(5))")  # loads no `early`
        assert reply["unsaved"] == ["g"]
        cell = "print(early + 1, next(g))"
        client.call("draft", session=session, source=cell)  # parked: its load waits
        _wait_session(client, session, lambda status: status["tier"] == "cool")
        reply, outputs = execute(client, session, cell)
        assert (reply["path"], text(outputs)) == ("pinned", "42 0\n")

    _with_server(tmp_path, driver, scenario, cool_after=1)

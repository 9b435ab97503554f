"""Templates with real CRIU: a dormant worker dumped once, restored many times, each copy in its
own PID namespace as a child of the server, running cells like a forked worker.

Needs root, the provisioned CRIU and pycriu, and llfabric-init; skipped without them, except
under CI, where their absence is a failure.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from helpers import execute, open_session, require_criu, serving, text

from fabric.errors import ConfigError, RemoteError
from fabric.pool import Pool, WorkerHandle
from fabric.pool.pool import choose_source
from fabric.worker.messages import CellOutput, Done, Load, RunCell

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _needs_criu() -> None:
    require_criu("templates")


async def _run(worker: WorkerHandle, source: str) -> tuple[str, dict]:
    """Run a cell on `worker` directly (no server); return its stdout and the done report."""
    await worker.send(RunCell(source, 1))
    out = []
    while not isinstance(message := await worker.recv(timeout=30), Done):
        if isinstance(message, CellOutput) and message.output["output_type"] == "stream":
            out.append(message.output["text"])
    return "".join(out), message.to_wire()


def test_copies_restore_concurrently_with_distinct_pids_and_identical_state(
        tmp_path: Path) -> None:
    family = frozenset({"json"})
    probe = ("import os, sys\n"
             "print(os.getpid(), os.readlink('/proc/self'), id(sys.modules['json']),"
             " sys.modules['json'].__dict__.get('mark'))")

    async def scenario() -> list[tuple[int, str]]:
        pool = Pool(tmp_path, worker_source="template")
        await pool.start()
        try:
            pool.templates.build_soon(family)
            template = await pool.templates.wait(family)
            assert template.state == "ready", template.error
            workers = await asyncio.gather(*(pool.new_worker(family) for _ in range(4)))
            assert {w.source for w in workers} == {"template"}
            seen = []
            for worker in workers:
                out, done = await _run(worker, probe + "\nsys.modules['json'].mark = 'mine'")
                assert done["status"] == "ok", out
                seen.append((worker.pid, out))
            for worker in workers:
                await worker.close()
            assert template.restores == 4  # the images were not consumed by the first restores
            assert (await pool.new_worker(family)).source == "template"
            return seen
        finally:
            await pool.stop()

    seen = asyncio.run(scenario())
    assert len({pid for pid, _ in seen}) == 4, seen  # each copy has its own init
    fields = [out.split() for _, out in seen]
    assert {f[0] for f in fields} == {"2"}  # the worker is pid 2 under its init, in each copy
    assert len({f[1] for f in fields}) == 4  # distinct host pids
    assert len({f[2] for f in fields}) == 1  # the same memory image
    assert {f[3] for f in fields} == {"None"}  # one copy's change is not seen by another


def test_copies_of_one_template_draw_different_random_numbers(tmp_path: Path) -> None:
    # Identical memory means identical RNG state: a fresh session's first load reseeds it.
    family = frozenset({"random"})

    async def scenario() -> set[str]:
        pool = Pool(tmp_path, worker_source="template")
        await pool.start()
        try:
            pool.templates.build_soon(family)
            assert (await pool.templates.wait(family)).state == "ready"
            draws = set()
            for _ in range(3):
                worker = await pool.new_worker(family)
                await worker.send(Load(cwd=str(tmp_path)))
                assert (await worker.recv(timeout=30)).error is None
                out, _ = await _run(worker, "import random\nprint(random.random())")
                draws.add(out)
                await worker.close()
            return draws
        finally:
            await pool.stop()

    assert len(asyncio.run(scenario())) == 3


def test_a_restored_worker_runs_cells_through_a_real_server(tmp_path: Path) -> None:
    # keep_warm=0: the second cell must come from the template, not the first cell's worker
    with serving(tmp_path / "store", worker_source="template", keep_warm=0) as server, \
            server.client() as client:
        session = open_session(client, tmp_path)
        reply, _ = execute(client, session, "x = 41")
        assert reply["source"] == "zygote"  # the family's template is still building
        deadline = time.monotonic() + 60
        while not any(t.state == "ready" for t in client.status().templates):
            assert time.monotonic() < deadline, client.status().templates
            time.sleep(0.1)

        reply, outputs = execute(client, session, "x += 1\nprint(x)")
        assert (reply["status"], reply["source"]) == ("ok", "template"), outputs
        assert text(outputs) == "42\n"

        # Killed mid-cell: the session stays on its last committed version.
        with pytest.raises(RemoteError) as died:
            execute(client, session, "x = 0\nimport os, signal\n"
                                     "os.kill(os.getpid(), signal.SIGKILL)")
        assert died.value.kind == "worker_died"
        assert "SIGKILL" in died.value.message
        reply, outputs = execute(client, session, "print(x)")
        assert reply["source"] == "template"
        assert text(outputs) == "42\n"
        status = client.status()
        assert status.templates[0].restores >= 3


def test_a_gpu_host_forks_its_workers_from_zygotes_even_where_templates_are_configured(
        caplog: pytest.LogCaptureFixture) -> None:
    # A template copy lives in a PID namespace whose /proc is the host's, where CUDA cannot
    # initialize (cudaGetDeviceCount: error 304 on an H200, driver 580): on a GPU host every
    # cell would fail on its first CUDA call.
    assert choose_source("template", gpu=False) == "template"
    assert choose_source("auto", gpu=True) == choose_source("auto", gpu=False) == "zygote"
    assert choose_source("template", gpu=True) == "zygote"
    assert "CUDA cannot initialize" in caplog.text
    with pytest.raises(ConfigError, match="worker_source"):
        choose_source("fork", gpu=False)

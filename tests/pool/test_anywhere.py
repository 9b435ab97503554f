"""Cooled and carried workers restore anywhere: a worker's own tree is restored in a PID
namespace of its own, with its own /proc (a nest), under the pids it had, whatever this host's
processes hold; dumped again from inside it, and restored again.

Needs root, CRIU, pycriu and llfabric-init (skipped without them, failed under CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import require_criu

from fabric.pool import Pool, WorkerHandle, lifecycle
from fabric.worker.messages import CellOutput, Done, RunCell

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _needs_criu() -> None:
    require_criu("restoring a worker in a namespace of its own")


async def _run(worker: WorkerHandle, source: str) -> str:
    """Run a cell on `worker` directly; its stdout (the cell must succeed)."""
    await worker.send(RunCell(source, 1))
    out = []
    while not isinstance(message := await worker.recv(timeout=60), Done):
        if isinstance(message, CellOutput):
            out.append(message.output.get("text", "") or str(message.output))
    assert message.status == "ok", out
    return "".join(out)


@contextlib.contextmanager
def _holding(pid: int) -> Iterator[subprocess.Popen]:
    """A process of this host under `pid`, made so by setting the last pid handed out."""
    for _ in range(50):  # another process may take it first on a busy host
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(pid - 1))
        holder = subprocess.Popen(["sleep", "600"])
        if holder.pid == pid:
            break
        holder.kill()
        holder.wait()
    else:
        pytest.fail(f"could not take pid {pid}")
    try:
        yield holder
    finally:
        holder.kill()
        holder.wait()


# the pid a cell sees, what its /proc calls it, and how many processes that /proc lists
PROBE = ("import os\nprint(os.getpid(), os.readlink('/proc/self'), "
         "sum(name.isdigit() for name in os.listdir('/proc')))")


def test_a_cooled_worker_restores_in_a_nest_where_its_pid_is_taken(tmp_path: Path) -> None:
    async def scenario() -> None:
        pool = Pool(tmp_path / "store", worker_source="zygote")
        await pool.start()
        try:
            worker = await pool.fork_worker(frozenset())
            await _run(worker, "g = (i for i in range(10))\nnext(g)")
            old = worker.process
            image = await lifecycle.cool(pool, worker)
            assert not image.init  # the worker's own tree
            with _holding(old):
                worker = await lifecycle.thaw(pool, image)
                assert worker.process != old and worker.init
                pid, proc_self, listed = (await _run(worker, PROBE)).split()
                # its pid as it was, and a /proc of its own namespace: its init, itself
                assert (int(pid), int(proc_self)) == (old, old) and int(listed) <= 3
                assert await _run(worker, "print(next(g))") == "1\n"
                # cooled again (dumped from inside its nest) and restored in another
                again = await lifecycle.cool(pool, worker)
                worker = await lifecycle.thaw(pool, again)
                assert await _run(worker, "import os\nprint(next(g), os.getpid())") == \
                    f"2 {old}\n"
            # signals reach it through its inits; a kill ends the nest with it
            worker.kill()
            assert await asyncio.wait_for(worker.died, 30) is not None
            await worker.close()
        finally:
            await pool.stop()

    asyncio.run(scenario())


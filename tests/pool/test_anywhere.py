"""Cooled and carried workers restore anywhere: a worker's own tree is restored in a PID
namespace of its own, with its own /proc (a nest), under the pids it had, whatever this host's
processes hold; dumped again from inside it, and restored again.

Needs root, CRIU, pycriu and llfabric-init (skipped without them, failed under CI).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from helpers import holding_pid, require_criu

from fabric.pool import Pool, WorkerHandle, criu, lifecycle, migration
from fabric.snapshot import Store
from fabric.worker.messages import CellOutput, Done, Loaded, Rehome, RunCell, Started

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
            with holding_pid(old):
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
            # signals reach it through its inits: an interrupt stops its cell (in one of its
            # short sleeps: Python handles a signal taken just before one as it returns); a
            # kill ends it
            await worker.send(RunCell("import time\nwhile True:\n    time.sleep(0.1)", 2))
            while not isinstance(await worker.recv(timeout=60), Started):
                pass
            worker.interrupt()
            while not isinstance(done := await worker.recv(timeout=60), Done):
                pass
            assert (done.status, done.ename) == ("error", "KeyboardInterrupt")
            worker.kill()
            assert await asyncio.wait_for(worker.died, 30) is not None
            await worker.close()
        finally:
            await pool.stop()

    asyncio.run(scenario())


def test_a_carried_worker_restores_where_its_store_and_directory_live_elsewhere(
        tmp_path: Path) -> None:
    """The worker maps a file of its host's store (as its arrays map chunks) and runs in its
    notebook's directory; carried to a host whose store and directory are at other paths, the
    old ones gone and its pid taken, it restores with the mapping (leaving no trace of the old
    store's path), uses the new store and runs in the new directory, or says the directory is
    not there."""
    here, there = tmp_path / "here", tmp_path / "there"
    (there / "notebooks").mkdir(parents=True)
    chunk = here / "store" / "blobs" / "ab" / "chunk"
    remote = f"file://{tmp_path}/remote"

    async def carry(directory: Path) -> tuple[str, Loaded]:
        (here / "notebooks").mkdir(parents=True)
        shutil.rmtree(there / "arrived", ignore_errors=True)
        sender, receiver = Pool(here / "store"), Pool(there / "store")
        await sender.start()
        await receiver.start()
        try:
            worker = await sender.fork_worker(frozenset())
            chunk.parent.mkdir(parents=True)
            chunk.write_bytes(b"carried" * 1000)
            await _run(worker, (
                f"import mmap, os\nos.chdir({str(here / 'notebooks')!r})\n"
                f"with open({str(chunk)!r}, 'rb') as f:\n"
                "    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
                "g = (i for i in range(10))\nnext(g)"))
            old = worker.process
            image = await lifecycle.cool(sender, worker, str(receiver.socket_dir))
            # between the hosts, through the stores (a remote tier stands for the peer)
            sent = Store(here / "store", chunk=1 << 16, remote=remote)
            held = lifecycle.Life.after_cell(sender, worker, "h" * 32, {"g", "m"}, ["g", "m"])
            carried = migration.pack(sent, image, held)
            sent.replicate([b for _, blobs in carried.files for b in blobs])
            arrived = there / "arrived"
            arrived.mkdir()
            landed = migration.unpack(Store(there / "store", key=sent.key, remote=remote),
                                      migration.Carried.from_wire(carried.to_wire()), arrived)
            criu.remove(image.images)
            shutil.rmtree(here)  # the old host's store and directory are not on this one
            with holding_pid(old):
                worker = await lifecycle.thaw(receiver, landed)
                assert not here.exists()  # what was put back for the restore is taken away
                await worker.send(Rehome(str(there / "store"), str(directory)))
                rehomed = await worker.recv(timeout=30)
                out = await _run(worker, "print(next(g), m[:7].decode(), os.getcwd())")
            await worker.close()
            return out, rehomed
        finally:
            await sender.stop()
            await receiver.stop()

    out, rehomed = asyncio.run(carry(there / "notebooks"))
    assert isinstance(rehomed, Loaded) and rehomed.error is None
    assert out == f"1 carried {there / 'notebooks'}\n"
    missing = there / "no-such-directory"
    out, rehomed = asyncio.run(carry(missing))
    assert f"the notebook's directory {missing} is not on this host" in rehomed.error
    assert out == "1 carried /\n"


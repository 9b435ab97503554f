"""A session against workers that misbehave (tests/support/fake_worker.py, real processes that
speak the worker wire): whatever a worker does, the session's head only moves on a good save,
the lease comes back, and the next cell runs."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from fabric.errors import CellStopped, StoreError, WorkerDied
from fabric.pool import Leases, Pool, WorkerHandle
from fabric.pool.lifecycle import Keeper
from fabric.session import Session
from fabric.snapshot import Store

FAKE = Path(__file__).resolve().parent / "support" / "fake_worker.py"
ROOT = FAKE.parent.parent.parent

pytestmark = pytest.mark.timeout(120)


class FakePool(Pool):
    """A pool whose workers are fake ones, each doing the next fault of `faults`."""

    def __init__(self, root: Path, faults: list[str]) -> None:
        super().__init__(root)
        self.faults = faults

    async def new_worker(self, needs: frozenset[str], family: frozenset[str] | None = None,
                         env: object = None, user: str = "") -> WorkerHandle:
        worker = WorkerHandle(self, next(self._ids), None, source="fake")
        pid = os.posix_spawn(sys.executable, [sys.executable, str(FAKE), worker.endpoint,
                                              str(self.store_root), self.faults.pop(0)],
                             {**os.environ, "PYTHONPATH": str(ROOT)})
        worker.process = pid
        worker.watch(pid, init=False)
        await self._hello(worker)
        return worker


def _scenario(tmp_path: Path, faults: list[str], cells: int, interrupt: bool = False) -> list:
    """Run `cells` cells, one worker each (doing `faults` in order); each cell's reply or error,
    with the session's version after it and the slots then free."""

    async def scenario() -> list:
        store = Store(tmp_path / "store")
        pool, leases = FakePool(store.root, faults), Leases(1)
        session = Session("s", str(tmp_path), store, pool, leases, Keeper(pool),
                          interrupt_grace=0.5)
        results = []
        try:
            for _ in range(cells):
                run = asyncio.ensure_future(session.execute("x = 1", lambda *a: None))
                if interrupt:
                    await asyncio.sleep(1.0)
                    session.interrupt()
                try:
                    result = await run
                except (WorkerDied, CellStopped, StoreError) as exc:
                    result = exc
                results.append((result, session.manifest.version, len(leases.held)))
        finally:
            await session.close()
            await pool.stop()
        return results

    return asyncio.run(scenario())


def test_a_clean_fake_cell_commits_a_version(tmp_path: Path) -> None:
    [(reply, version, held)] = _scenario(tmp_path, ["ok"], 1)
    assert reply.status == "ok" and reply.version == version == 1 and held == 0


@pytest.mark.parametrize(("fault", "error"), [("garbage", WorkerDied), ("die", WorkerDied),
                                              ("missing", StoreError)])
def test_a_worker_that_fails_mid_cell_leaves_the_head_and_the_next_cell_runs(
        tmp_path: Path, fault: str, error: type) -> None:
    (failed, before, held), (reply, after, _) = _scenario(tmp_path, [fault, "ok"], 2)
    assert isinstance(failed, error) and before == 0 and held == 0
    assert reply.status == "ok" and after == 1


def test_a_worker_that_never_answers_is_stopped_after_its_interrupt(tmp_path: Path) -> None:
    [(stopped, version, held)] = _scenario(tmp_path, ["silent"], 1, interrupt=True)
    assert isinstance(stopped, CellStopped) and stopped.fields["reason"] == "interrupt"
    assert version == 0 and held == 0


def test_a_cpu_slot_goes_back_once_the_cells_state_is_only_written(tmp_path: Path) -> None:
    async def scenario() -> tuple[bool, bool, object, int]:
        store = Store(tmp_path / "store")
        pool, leases = FakePool(store.root, ["flushing"]), Leases(1)
        session = Session("s", str(tmp_path), store, pool, leases, Keeper(pool))
        output = asyncio.Event()  # the cell's output: its code ran, on the slot
        try:
            run = asyncio.ensure_future(session.execute("x = 1", lambda *a: output.set()))
            await output.wait()
            deadline = time.monotonic() + 30
            while leases.held and time.monotonic() < deadline:  # until the slot is back
                await asyncio.sleep(0.01)
            free, writing = not leases.held, not run.done()
            (tmp_path / "flushed").touch()
            reply = await run
            return free, writing, reply, session.manifest.version
        finally:
            await session.close()
            await pool.stop()

    free, writing, reply, version = asyncio.run(scenario())
    assert free and writing  # the slot is back while the cell still writes its state
    assert reply.status == "ok" and version == 1  # and it commits all the same

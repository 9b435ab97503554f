"""Retiring a worker ends, whatever its socket was doing when the retirement came."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from fabric.pool import Pool
from fabric.pool.pool import WorkerHandle
from fabric.worker.messages import Exit


def test_a_worker_retired_while_a_send_to_it_waits_is_killed_not_waited_on(
        tmp_path: Path) -> None:
    """A load's send blocked on a worker that is gone from its socket (it died, not yet told),
    cancelled as its life is replaced: the retirement's Exit must not queue behind it."""
    async def scenario() -> int | None:
        pool = Pool(tmp_path)  # its zygotes are not started: this worker is a bare process
        stand_in = subprocess.Popen(["sleep", "600"], start_new_session=True)
        worker = WorkerHandle(pool, 1, None, source="cold")
        worker.process = stand_in.pid
        worker.cage.enter(stand_in.pid)
        worker.watch(stand_in.pid, init=False)
        try:
            async def load_then_retire() -> None:
                try:
                    await worker.send(Exit())  # no peer on the socket: it waits
                except asyncio.CancelledError:
                    await worker.close()
                    raise

            loading = asyncio.ensure_future(load_then_retire())
            while not worker.socket._send_futures:  # the send is queued
                await asyncio.sleep(0.01)
            loading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(loading, 60)
            return await asyncio.wait_for(asyncio.shield(worker.died), 10)
        finally:
            stand_in.kill()
            await pool.stop()

    assert asyncio.run(scenario()) is not None  # it was killed, its exit reported

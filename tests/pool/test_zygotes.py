"""The zygote tree: families forked from their nearest ancestor, bounded by count and memory."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from fabric.pool import Pool
from fabric.pool import pool as pool_module


def test_families_past_the_memory_bound_are_evicted_least_recently_used_first(
        tmp_path: Path) -> None:
    async def scenario() -> list[list[str]]:
        pool = Pool(tmp_path, max_zygotes=10, zygote_memory=1)  # any family is over the bound
        await pool.start()
        try:
            json_zygote = await pool.zygote_for(frozenset({"json"}))
            worker = await pool.fork_worker(frozenset({"json"}))  # keeps its zygote alive
            await pool.zygote_for(frozenset({"csv"}))
            await pool.zygote_for(frozenset({"decimal"}))  # csv: least recently used, idle
            kept = [z["modules"] for z in pool.status()["zygotes"]]
            assert all(z["memory"] > 0 for z in pool.status()["zygotes"])
            assert json_zygote.ctrl.fileno() >= 0  # spared: a live worker depends on it
            await worker.close()
            return kept
        finally:
            await pool.stop()

    kept = asyncio.run(scenario())
    assert sorted(kept) == [[], ["decimal"], ["json"]]


def test_a_dead_or_hung_base_zygote_is_replaced_and_workers_start_cold_meanwhile(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pool_module, "START_TIMEOUT", 5.0)  # for the hung one

    async def replaced(pool: Pool, old: int) -> int:
        for _ in range(600):
            base = pool.zygotes.get(frozenset())
            if base is not None and base.pid != old and base.ready.done():
                return base.pid
            await asyncio.sleep(0.1)
        raise AssertionError("no new base zygote")

    async def scenario() -> None:
        pool = Pool(tmp_path)
        await pool.start()
        try:
            dead = pool.zygotes[frozenset()].pid
            os.kill(dead, signal.SIGKILL)
            worker = await pool.new_worker(frozenset())
            assert worker.source == "cold"
            await worker.close()
            hung = await replaced(pool, dead)
            assert not Path(f"/proc/{dead}").exists()  # reaped
            os.kill(hung, signal.SIGSTOP)  # alive, but it will never answer
            worker = await pool.new_worker(frozenset())
            assert worker.source == "cold"
            await worker.close()
            await replaced(pool, hung)
            worker = await pool.new_worker(frozenset())
            assert worker.source == "zygote"
            await worker.close()
        finally:
            await pool.stop()

    asyncio.run(scenario())

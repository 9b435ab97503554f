"""The zygote tree: families forked from their nearest ancestor, bounded by count and memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fabric.pool import Pool


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

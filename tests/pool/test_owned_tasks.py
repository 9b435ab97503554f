"""What a session, the keeper and the pool run in the background ends when they close: a kept
worker lingering on its lease, its close, the pool's builds; nothing is left pending."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fabric.pool import Leases, Pool
from fabric.pool.lifecycle import Keeper
from fabric.session import Session
from fabric.snapshot import Store

pytestmark = pytest.mark.timeout(120)


def test_closing_a_session_with_a_worker_lingering_on_its_lease_leaves_no_task_pending(
        tmp_path: Path) -> None:
    async def scenario() -> tuple[str, int, set[asyncio.Task]]:
        store = Store(tmp_path / "store")
        pool = Pool(store.root, keep_warm=600.0)
        leases, keeper = Leases(1, linger=600.0), Keeper(pool)  # it would linger for minutes
        await pool.start()
        try:
            session = Session("s", str(tmp_path), store, pool, leases, keeper)
            reply = await session.execute("x = 1", lambda *a: None)
            lingering = len(leases.held)  # the kept worker keeps the cell's lease
            await session.close()
        finally:
            await keeper.stop()
            await pool.stop()
        return reply.status, lingering, asyncio.all_tasks() - {asyncio.current_task()}

    status, lingering, pending = asyncio.run(scenario())
    assert status == "ok" and lingering == 1
    assert pending == set()


def test_stopping_the_pool_while_a_draft_readies_a_worker_leaves_no_task_pending(
        tmp_path: Path) -> None:
    async def scenario() -> set[asyncio.Task]:
        store = Store(tmp_path / "store")
        pool = Pool(store.root)
        leases, keeper = Leases(1), Keeper(pool)
        await pool.start()
        try:
            session = Session("s", str(tmp_path), store, pool, leases, keeper)
            session.draft("import json")  # a worker is forked and loaded in the background
            await session.close()
        finally:
            await keeper.stop()
            await pool.stop()
        return asyncio.all_tasks() - {asyncio.current_task()}

    assert asyncio.run(scenario()) == set()

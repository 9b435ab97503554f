"""A background task's owner (`fabric.tasks.Background`): closing it cancels what still runs and
waits for each to end, leaving none pending; a failure nobody awaits is logged, not lost."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fabric.tasks import Background


def test_closing_the_owner_cancels_its_tasks_waits_for_them_and_leaves_none_pending() -> None:
    async def scenario() -> list[str]:
        ended: list[str] = []
        started = asyncio.Event()

        async def forever(name: str) -> None:
            try:
                started.set()
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0)  # its clean-up awaits: close waits for it
                ended.append(name)

        owner = Background("test")
        owner.start(forever("a"), "waiting")
        owner.start(forever("b"), "waiting")
        await started.wait()
        await owner.close()
        assert len(owner) == 0
        assert asyncio.all_tasks() == {asyncio.current_task()}
        return sorted(ended)

    assert asyncio.run(scenario()) == ["a", "b"]


def test_a_failure_nobody_awaits_is_logged_and_the_other_tasks_run_on(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> bool:
        async def fail() -> None:
            raise ValueError("the disk is full")

        owner = Background("the pool")
        other = owner.start(asyncio.Event().wait(), "waiting")
        with caplog.at_level(logging.WARNING, logger="fabric.tasks"):
            failed = owner.start(fail(), "a rebuild")
            await asyncio.wait({failed})
        running = not other.done()
        await owner.close()
        return running

    assert asyncio.run(scenario())
    assert "the pool: a rebuild failed: the disk is full" in caplog.text


def test_a_failure_its_caller_awaits_reaches_the_caller_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async def fail() -> None:
            raise ValueError("no zygote")

        owner = Background("the pool")
        with caplog.at_level(logging.WARNING, logger="fabric.tasks"), \
                pytest.raises(ValueError, match="no zygote"):
            await owner.start(fail())
        await owner.close()

    asyncio.run(scenario())
    assert "no zygote" not in caplog.text

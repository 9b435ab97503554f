"""A background task's owner (`fabric.tasks.Background`): closing it cancels what still runs and
waits for each to end, leaving none pending; a failure nobody awaits is logged, not lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

import pytest

from fabric.tasks import Background, within


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


@pytest.mark.parametrize("wait", [within, asyncio.wait_for])
def test_a_loop_cancelled_as_its_wait_ends_ends(wait) -> None:
    # The event is set and the loop cancelled in one turn of the event loop, as a commit's
    # wake-up and a server's stop may come: the cancel must not be lost.
    async def scenario() -> bool:
        wanted = asyncio.Event()
        turns = 0

        async def serve() -> None:
            nonlocal turns
            while True:
                with contextlib.suppress(TimeoutError):
                    await wait(wanted.wait(), 30)
                wanted.clear()
                turns += 1

        task = asyncio.get_running_loop().create_task(serve())
        await asyncio.sleep(0)  # it waits now
        wanted.set()
        await asyncio.sleep(0)  # the wait has its result; the loop has not taken it yet
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5 if wait is within else 1)
        task.cancel()
        return bool(done)

    ended = asyncio.run(scenario())
    if wait is within:
        assert ended
    elif sys.version_info < (3, 12):
        assert not ended  # asyncio.wait_for's flaw on 3.11, which `within` avoids

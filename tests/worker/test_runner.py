"""A real forked worker answers what is not a message of its wire with a refusal, never silence,
and goes on serving."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from fabric import protocol
from fabric.pool import Pool
from fabric.worker.account import Account
from fabric.worker.messages import (
    Become,
    Done,
    Load,
    Loaded,
    Message,
    Output,
    Refused,
    Run,
)

pytestmark = pytest.mark.timeout(120)


def test_a_worker_refuses_a_bad_message_by_name_and_serves_on(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[str], str, str]:
        pool = Pool(tmp_path)
        await pool.start()
        try:
            worker = await pool.fork_worker(frozenset())
            refusals = []
            for bad in ({"op": "bogus"}, {"op": "run"}, {"op": "load", "groups": "x"},
                        {"op": "done", "status": "ok"}):  # the worker's own message
                await worker.socket.send(protocol.pack(bad))
                reply = await worker.recv(timeout=30)
                assert isinstance(reply, Refused), reply
                refusals.append(reply.message)
            await worker.send(Load(cwd=str(tmp_path)))
            loaded = await worker.recv(timeout=30)
            assert isinstance(loaded, Loaded) and loaded.error is None
            await worker.send(Run("print(6 * 7)"))
            printed = []
            while not isinstance(message := await worker.recv(timeout=30), Done):
                if isinstance(message, Output):
                    printed.append(message.output.get("text", ""))
            await worker.close()
            return refusals, "".join(printed), message.status
        finally:
            await pool.stop()

    refusals, printed, status = asyncio.run(scenario())
    assert "unknown worker message 'bogus'" in refusals[0]
    assert "run.source is missing" in refusals[1]
    assert "load.groups is 'x'" in refusals[2]
    assert "unknown worker message 'done'" in refusals[3]
    assert (printed, status) == ("42\n", "ok")


def test_a_worker_becomes_a_user_only_first_and_never_root(tmp_path: Path) -> None:
    """`Become` is taken only before anything of a session is loaded (a worker that loaded as
    the server's user keeps what that user could read), and never to root."""
    root = Account("root", 0, 0, [0], "/root", str(tmp_path))

    async def scenario() -> tuple[Message, Message]:
        pool = Pool(tmp_path)
        await pool.start()
        try:
            fresh = await pool.fork_worker(frozenset())
            await fresh.send(Become(root))
            as_root = await fresh.recv(timeout=30)
            loaded = await pool.fork_worker(frozenset())
            await loaded.send(Load(cwd=str(tmp_path)))
            assert isinstance(await loaded.recv(timeout=30), Loaded)
            await loaded.send(Become(dataclasses.replace(root, name="nobody", uid=65534)))
            late = await loaded.recv(timeout=30)
            for worker in (fresh, loaded):
                await worker.close()
            return as_root, late
        finally:
            await pool.stop()

    as_root, late = asyncio.run(scenario())
    assert isinstance(as_root, Loaded) and "as root" in (as_root.error or "")
    assert isinstance(late, Refused) and "before its first load" in late.message

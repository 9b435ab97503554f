"""A real forked worker answers what is not a message of its wire with a refusal, never silence,
and goes on serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fabric import protocol
from fabric.pool import Pool
from fabric.worker.messages import Done, Load, Loaded, Output, Refused, Run

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

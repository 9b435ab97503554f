"""A real forked worker answers what is not a message of its wire with a refusal, never silence,
and goes on serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fabric import protocol
from fabric.pool import Pool
from fabric.worker.messages import (
    Answered,
    Complete,
    Done,
    Inspect,
    Load,
    Loaded,
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


CELL = '''class Thing:
    def method_one(self):
        """Say one."""
class Broken:
    def __dir__(self):
        raise RuntimeError('no dir')
    def __repr__(self):
        raise RuntimeError('no repr')
thing, broken = Thing(), Broken()
zip?
'''


def test_a_worker_answers_questions_between_cells_and_sends_its_payloads(
        tmp_path: Path) -> None:
    """Completion and inspection on the live namespace; what a user's object raises is the
    answer's error, and the worker serves on; `?` is a page payload of the cell's done."""
    async def scenario() -> tuple[Done, list[dict]]:
        pool = Pool(tmp_path)
        await pool.start()
        try:
            worker = await pool.fork_worker(frozenset())
            await worker.send(Load(cwd=str(tmp_path)))
            assert isinstance(await worker.recv(timeout=30), Loaded)
            await worker.send(Run(CELL))
            while not isinstance(done := await worker.recv(timeout=30), Done):
                pass
            answers = []
            for question in (Complete("thing.meth", 10), Inspect("thing.method_one", 16),
                             Complete("broken.", 7), Inspect("broken", 3),
                             Complete("x", 99), Inspect("nothing", 2, 1)):
                await worker.send(question)
                answer = await worker.recv(timeout=30)
                assert isinstance(answer, Answered), answer
                answers.append(answer.content)
            await worker.close()
            return done, answers
        finally:
            await pool.stop()

    done, answers = asyncio.run(scenario())
    assert done.status == "ok" and [p["source"] for p in done.payload] == ["page"]
    assert "zip" in done.payload[0]["data"]["text/plain"]
    assert done.saved is not None
    described = done.saved.described
    assert "method_one" in described["classes"][described["names"]["thing"]["class"]]["attrs"]
    assert described["names"]["broken"]["attrs"] == []  # its __dir__ raised: left out
    assert answers[0]["matches"] == ["method_one"] and answers[0]["cursor_start"] == 6
    assert answers[1]["found"] and "Say one." in answers[1]["data"]["text/plain"]
    assert answers[2]["status"] in ("ok", "error") and answers[3]["status"] in ("ok", "error")
    assert answers[4]["status"] == "ok" and not answers[5]["found"]

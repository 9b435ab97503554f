"""A real forked worker answers what is not a message of its wire with a refusal, never silence,
and goes on serving."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from helpers import cells_on_one_worker

from fabric import protocol
from fabric.pool import Pool
from fabric.worker.account import Account
from fabric.worker.messages import (
    Answered,
    Become,
    CellOutput,
    CompleteCode,
    Done,
    InspectName,
    Load,
    Loaded,
    Refused,
    RunCell,
    WorkerMessage,
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
            await worker.send(RunCell("print(6 * 7)"))
            printed = []
            while not isinstance(message := await worker.recv(timeout=30), Done):
                if isinstance(message, CellOutput):
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

    async def scenario() -> tuple[WorkerMessage, WorkerMessage]:
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
            await worker.send(RunCell(CELL))
            while not isinstance(done := await worker.recv(timeout=30), Done):
                pass
            answers = []
            for question in (CompleteCode("thing.meth", 10), InspectName("thing.method_one", 16),
                             CompleteCode("broken.", 7), InspectName("broken", 3),
                             CompleteCode("x", 99), InspectName("nothing", 2, 1)):
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


def test_a_save_describes_only_the_values_a_cell_changed(tmp_path: Path) -> None:
    """A value whose object is the one saved before keeps its description (the commit merges
    the parent's), and so does a module: a cell that only reads describes nothing it read."""
    cells = ["import math\nrows = [{'id': i} for i in range(1000)]\nlimit = 3",
             "total = len(rows) + limit + math.floor(0.5)",
             "rows.append({'id': -1})",
             "import cmath as math"]

    described = []
    for done in cells_on_one_worker(tmp_path, cells):
        assert done.status == "ok" and done.saved is not None, done
        described.append(done.saved.described["names"])
    assert sorted(described[0]) == ["limit", "math", "rows"]
    assert sorted(described[1]) == ["total"]
    assert sorted(described[2]) == ["rows"] and described[2]["rows"]["len"] == 1001
    assert sorted(described[3]) == ["math"] and "phase" in described[3]["math"]["attrs"]


def test_a_forked_worker_leaves_its_zygotes_objects_to_them_and_collects_its_own(
        tmp_path: Path) -> None:
    # The zygote's imports are frozen out of the collector: a worker's collections leave their
    # pages shared. Its own cycles are collected as ever.
    cells = ["import gc, IPython\n"
             "assert gc.get_freeze_count() > 1000\n"
             "shell = IPython.core.interactiveshell.InteractiveShell\n"
             "assert not any(o is shell for o in gc.get_objects())",
             "class Node: pass\n"
             "node = Node(); node.me = node; del node\n"
             "assert gc.collect() >= 1"]
    for done in cells_on_one_worker(tmp_path, cells):
        assert done.status == "ok", done

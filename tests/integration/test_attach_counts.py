"""Prompt numbers and a server that is down, as a user of an attached kernel meets them: against
a real server and a real kernel driven by jupyter_client."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from attached import Kernel
from helpers import RunningServer, serving


@pytest.fixture
def session() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    with serving(tmp_path / "store", keep_warm=0) as running:
        yield running


def _prompts(kernel: Kernel, code: str) -> tuple[int, bool, list[int]]:
    """The cell's reply number, whether it succeeded, and the numbers of its results."""
    reply, outputs = kernel.execute(code)
    results = [m["content"]["execution_count"] for m in outputs
               if m["msg_type"] == "execute_result"]
    return reply["execution_count"], reply["status"] == "ok", results


def test_each_cell_takes_the_next_number_local_ones_too(kernel: Kernel, server: RunningServer,
                                                        session: str) -> None:
    cells = ["x = 1", "%llfabric status", "x", "%%local\n2", "x + 1", "%llfabric tag one",
             "x + 2", "%llfabric checkout one", "x + 3"]
    numbers = []
    for code in cells:
        count, ok, results = _prompts(kernel, code)
        assert ok, code
        assert all(r == count for r in results)  # Out[n] is the prompt's n
        numbers.append(count)
    assert numbers == list(range(1, len(cells) + 1))
    with server.client() as client:
        [mine] = [s for s in client.status().sessions if s.session == session]
    assert mine.execution_count == len(cells)  # the store records the prompt numbers


def test_a_server_down_is_said_before_the_cell_is_sent(kernel: Kernel,
                                                       server: RunningServer) -> None:
    reply, _ = kernel.execute("y = 1")
    assert reply["status"] == "ok"
    server.stop()
    reply, outputs = kernel.execute("y", timeout=60)
    [error] = [m["content"] for m in outputs if m["msg_type"] == "error"]
    assert "the cell was not sent" in error["evalue"]  # not after the relay's patience ran out
    assert "llfabric serve" in error["evalue"]
    assert reply["status"] == "error" and reply["execution_count"] == 2  # a failed cell's number


def _restart(kernel: Kernel, asked: bool) -> None:
    """Restart as JupyterLab's Restart Kernel does (`asked`: a shutdown_request with restart),
    or as a kernel that died is replaced (killed, then started again)."""
    kernel.client.stop_channels()
    kernel.manager.restart_kernel(now=not asked)
    kernel.client = kernel.manager.client()
    kernel.client.start_channels()
    kernel.client.wait_for_ready(timeout=60)


def test_restart_asked_for_empties_the_session_and_numbers_from_one(kernel: Kernel) -> None:
    kernel.execute("kept = 1")
    _restart(kernel, asked=False)  # a kernel that died: the session goes on
    reply, outputs = kernel.execute("kept")
    assert reply["status"] == "ok" and reply["execution_count"] == 2
    kernel.execute("%llfabric tag before")
    _restart(kernel, asked=True)
    reply, outputs = kernel.execute("'kept' in globals()")
    assert reply["execution_count"] == 1, [m["content"] for m in outputs]
    assert [m["content"]["data"]["text/plain"] for m in outputs
            if m["msg_type"] == "execute_result"] == ["False"]
    reply, _ = kernel.execute("%llfabric checkout before")  # the old state is one step away
    reply, outputs = kernel.execute("kept")
    assert reply["status"] == "ok" and reply["execution_count"] == 3


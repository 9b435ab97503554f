"""A cell outlives its kernel: killed while the cell runs, the kernel started in its place shows
the cell's outputs, from its first line, in its own first cell, which then sees what the cell
defined."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from attached import Kernel, kernel_env, text_of
from helpers import RunningServer, printing_cell, serving
from jupyter_client.kernelspec import KernelSpecManager

LINES = 25  # 5 s: the new kernel starts while it runs
LONG = printing_cell(LINES)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), keep_warm=0, heartbeat=1,
                 heartbeat_timeout=2) as running:
        yield running


def test_a_new_kernel_shows_the_cell_its_killed_predecessor_left_running(
        server: RunningServer, specs: KernelSpecManager, tmp_path: Path) -> None:
    session = f"k-{uuid.uuid4().hex[:10]}"
    env = kernel_env(server.address, session)
    first = Kernel.start(specs, env, tmp_path)
    try:
        first.execute("warm = 1")
        first.client.execute(LONG)  # not waited for: its kernel dies while it runs
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline, "the long cell never started"
            time.sleep(0.05)
        time.sleep(0.5)
        os.kill(first.manager.provisioner.process.pid, signal.SIGKILL)
    finally:
        first.stop()
    second = Kernel.start(specs, env, tmp_path)
    try:
        reply, outputs = second.execute("print(done)")
        assert reply["status"] == "ok"
        lines = "".join(f"line {i}\n" for i in range(LINES))
        assert text_of(outputs) == lines + "yes\n"  # all of it, in order, then this cell's
        assert "running when this kernel started" in text_of(outputs, "stderr")
        reply, outputs = second.execute("print(warm)")
        assert text_of(outputs) == "1\n" and text_of(outputs, "stderr") == ""  # followed once
    finally:
        second.stop()

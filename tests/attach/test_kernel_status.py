"""The status a frontend reads of an attached kernel, as JupyterLab reads it (the latest status
message, whatever request it is about): busy while a cell runs, though requests on a kernel
subshell (the extension's drafts) come and go beside it."""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from attached import Kernel, install_test_kernelspec, kernel_env
from helpers import serving

WAITING = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)"


@pytest.fixture
def kernel(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Iterator[Kernel]:
    specs = install_test_kernelspec(tmp_path_factory.mktemp("jupyter"))
    with serving(tmp_path_factory.mktemp("store"), keep_warm=0) as server:
        running = Kernel.start(specs, kernel_env(server.address, f"s-{uuid.uuid4().hex[:10]}"),
                               tmp_path)
        try:
            yield running
        finally:
            (tmp_path / "go").touch()
            running.stop()


def _statuses_until(kernel: Kernel, done, timeout: float = 60) -> list[tuple[str, str]]:
    """(execution_state, parent msg_id) of each status message, until `done` of the list."""
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    while not done(seen):
        assert time.monotonic() < deadline, f"statuses so far: {seen}"
        try:
            msg = kernel.client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["msg_type"] == "status":
            seen.append((msg["content"]["execution_state"], msg["parent_header"].get("msg_id")))
    return seen


def test_a_kernel_reads_busy_while_its_cell_runs_beside_subshell_requests(
        kernel: Kernel, tmp_path: Path) -> None:
    client = kernel.client
    cell = client.execute(WAITING)
    _statuses_until(kernel, lambda seen: ("busy", cell) in seen)
    create = client.session.msg("create_subshell_request", {})
    client.control_channel.send(create)
    reply = client.get_control_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == create["header"]["msg_id"]
    subshell = reply["content"]["subshell_id"]
    draft = client.session.msg("comm_open", {"comm_id": uuid.uuid4().hex, "target_name":
                                             "llfabric.draft", "data": {"source": "x = 1"}})
    draft["header"]["subshell_id"] = subshell
    client.shell_channel.send(draft)
    ours = draft["header"]["msg_id"]
    seen = _statuses_until(kernel, lambda seen: ("idle", ours) in seen)
    assert ("idle", cell) not in seen  # the cell still runs
    # what a frontend reads next: the cell's busy again, not the draft's idle
    after = _statuses_until(kernel, lambda seen: len(seen) == 1, timeout=30)
    assert after == [("busy", cell)]
    (tmp_path / "go").touch()
    assert _statuses_until(kernel, lambda seen: ("idle", cell) in seen)[-1] == ("idle", cell)

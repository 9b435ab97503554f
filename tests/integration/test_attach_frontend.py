"""The comms of the JupyterLab extension (labextension/) with an attached kernel, driven as the
extension drives them, by jupyter_client against a real kernel and a real server."""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from attached import Kernel
from helpers import RunningServer, hold_a_slot, serving, wait_until

from fabric.status import SessionStatus


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # one slot, so that another session's cell makes ours queue; no worker kept after a cell,
    # so that a prepared worker shows that a draft arrived
    with serving(tmp_path_factory.mktemp("store"), slots=1, keep_warm=0) as running:
        yield running


@pytest.fixture
def session() -> str:
    return f"f-{uuid.uuid4().hex[:10]}"


def _open_comm(kernel: Kernel, target: str, data: dict) -> str:
    comm_id = uuid.uuid4().hex
    client = kernel.client
    client.shell_channel.send(client.session.msg("comm_open", {
        "comm_id": comm_id, "target_name": target, "data": data}))
    return comm_id


def _send(kernel: Kernel, comm_id: str, data: dict) -> None:
    client = kernel.client
    client.shell_channel.send(client.session.msg("comm_msg", {"comm_id": comm_id, "data": data}))


def _comm_data(kernel: Kernel, comm_id: str, wanted: Callable[[dict], bool],
               timeout: float = 60) -> dict:
    """The first message the kernel sends on `comm_id` that is `wanted`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kernel.client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        content = msg["content"]
        if msg["msg_type"] == "comm_msg" and content["comm_id"] == comm_id and \
                wanted(content["data"]):
            return content["data"]
    raise AssertionError(f"no such message on comm {comm_id} in {timeout} s")


def _prepared(server: RunningServer, session: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with server.client() as client:
            mine = [s for s in client.status().sessions if s.session == session]
        if mine and mine[0].prepared:
            return True
        time.sleep(0.1)
    return False


def test_the_status_comm_tells_the_session_and_its_changes(kernel: Kernel,
                                                           session: str) -> None:
    comm = _open_comm(kernel, "llfabric.status", {})
    first = _comm_data(kernel, comm, lambda d: "status" in d)["status"]
    assert first["session"] == session and first["version"] == 0
    assert first["lease"] == "released" and first["tier"] == "cold"
    assert first["kind"] in ("gpu", "cpu") and first["saved_hours"] >= 0
    reply, outputs = kernel.execute("x = 1", cell_id="first")
    assert reply["status"] == "ok"
    assert [m for m in outputs if m["msg_type"] != "comm_msg"] == []  # the cell shows nothing
    # how the notebook's cell started, for its prompt
    assert [m["content"]["data"]["started"] for m in outputs
            if "started" in m["content"].get("data", {})] == \
        [{"cell_id": "first", "execution_count": 1, "start": "cold"}]
    after = _comm_data(kernel, comm, lambda d: d.get("status", {}).get("version") == 1)
    assert after["status"]["lease"] == "released"


def test_a_slot_wait_is_a_notice_and_a_queue_position(kernel: Kernel, server: RunningServer,
                                                      session: str) -> None:
    comm = _open_comm(kernel, "llfabric.status", {})
    _comm_data(kernel, comm, lambda d: "status" in d)
    holder = hold_a_slot(server, 8)
    try:
        reply, messages = _run_watching(kernel, "'ran'")
    finally:
        holder.join()
    assert reply["status"] == "ok"
    mine = [m for m in messages if m["parent_header"].get("msg_id") == reply["msg_id"]]
    # the wait is llfabric's news: a notice and the queue position, not the cell's outputs
    assert [m["msg_type"] for m in mine if m["msg_type"] in ("stream", "execute_result",
                                                           "display_data", "error")] == \
        ["execute_result"]
    data = [m["content"]["data"] for m in messages
            if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm]
    assert any("execution slot" in d.get("notice", "") for d in data)
    assert {"lease": "queued", "position": 1} in [
        {k: d["status"].get(k) for k in ("lease", "position")} for d in data if "status" in d]


def _run_watching(kernel: Kernel, code: str, timeout: float = 120) -> tuple[dict, list[dict]]:
    """Run a cell; its reply (with its msg_id) and every IOPub message until it is idle."""
    msg_id = kernel.client.execute(code)
    messages: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kernel.client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["parent_header"].get("msg_id") == msg_id and \
                msg["content"]["execution_state"] == "idle":
            break
    reply = kernel.client.get_shell_msg(timeout=10)
    return {**reply["content"], "msg_id": msg_id}, messages


def test_live_drafts_prepare_a_worker_and_stale_revisions_are_dropped(
        kernel: Kernel, server: RunningServer, session: str) -> None:
    kernel.execute("w = 1")
    assert not _prepared(server, session, timeout=1)
    comm = _open_comm(kernel, "llfabric.draft", {"source": "w +", "revision": 1})
    _send(kernel, comm, {"source": "w + 1", "revision": 2})
    assert _prepared(server, session)
    kernel.execute("w + 1")  # the prepared worker runs it, and is retired after (keep_warm=0)
    assert not _prepared(server, session, timeout=1)
    _send(kernel, comm, {"source": "w + 2", "revision": 2})  # not newer than one already sent
    assert not _prepared(server, session, timeout=3)
    _send(kernel, comm, {"source": "w + 2", "revision": 3})
    assert _prepared(server, session)


def _versions(kernel: Kernel, comm: str, head: int) -> dict:
    """The history comm's versions once the session's head is `head` (asked for: what the kernel
    sent after a cell may have gone by with that cell's messages)."""
    _send(kernel, comm, {"op": "list"})
    return _comm_data(kernel, comm, lambda d: "versions" in d and d["version"] == head)


def test_the_history_comm_lists_versions_and_checks_one_out(kernel: Kernel,
                                                            session: str) -> None:
    comm = _open_comm(kernel, "llfabric.history", {})
    first = _comm_data(kernel, comm, lambda d: "versions" in d)
    assert first == {"session": session, "versions": [], "version": 0}  # nothing ran yet
    kernel.execute("x = 1\nimport math")
    kernel.execute("x = 2\ny = 'why'")
    versions = _versions(kernel, comm, 2)["versions"]
    assert [v["version"] for v in versions] == [2, 1]
    latest, earliest = versions
    assert latest["first_line"] == "x = 2" and latest["lines"] == 2
    assert latest["execution_count"] == 2 and latest["status"] == "ok"
    assert (latest["added"], latest["changed"], latest["removed"]) == (["y"], ["x"], [])
    assert earliest["added"] == ["math", "x"] and earliest["checkout"] is None
    assert latest["size"] > 0 and latest["variables"] == 2 and latest["time"] > 0
    _send(kernel, comm, {"op": "checkout", "version": 1})
    done = _comm_data(kernel, comm, lambda d: "checked_out" in d or "error" in d)
    assert done == {"checked_out": 1, "version": 3}
    after = _versions(kernel, comm, 3)["versions"][0]
    assert after["checkout"] == 1 and after["first_line"] == ""
    assert (after["added"], after["changed"], after["removed"]) == ([], ["x"], ["y"])
    reply, outputs = kernel.execute("x")  # the next cell runs on version 1's state
    assert [m["content"]["data"]["text/plain"] for m in outputs
            if m["msg_type"] == "execute_result"] == ["1"]
    assert reply["execution_count"] == 3  # prompt numbers go on, as after %llfabric checkout
    _send(kernel, comm, {"op": "checkout", "version": 99})
    assert "no version 99" in _comm_data(kernel, comm, lambda d: "error" in d)["error"]


def _on_subshell(kernel: Kernel, msg_type: str, content: dict, subshell: str) -> None:
    client = kernel.client
    message = client.session.msg(msg_type, content)
    message["header"]["subshell_id"] = subshell
    client.shell_channel.send(message)


def _status_of(server: RunningServer, session: str) -> SessionStatus | None:
    with server.client() as client:
        return client.status().session(session)


def test_a_draft_sent_on_a_subshell_reaches_the_server_while_a_cell_runs(
        kernel: Kernel, server: RunningServer, session: str, tmp_path: Path) -> None:
    client = kernel.client
    info = client.kernel_info(reply=True, timeout=30)["content"]
    assert "kernel subshells" in info.get("supported_features", [])
    client.control_channel.send(client.session.msg("create_subshell_request", {}))
    subshell = client.get_control_msg(timeout=30)["content"]["subshell_id"]
    kernel.execute("w = 1")
    comm_id = uuid.uuid4().hex
    _on_subshell(kernel, "comm_open", {"comm_id": comm_id, "target_name": "llfabric.draft",
                                       "data": {}}, subshell)
    flag = tmp_path / "go"
    running = client.execute(f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n"
                             "    time.sleep(0.05)")
    try:
        wait_until(lambda: getattr(_status_of(server, session), "running", False),
                   "the cell started")
        assert not _status_of(server, session).prepared
        # the kernel's main thread waits for the cell: the subshell's thread takes the draft
        _on_subshell(kernel, "comm_msg", {"comm_id": comm_id,
                                          "data": {"source": "w + 1", "revision": 1}}, subshell)
        wait_until(lambda: _status_of(server, session).prepared, "the draft reached the server")
        assert _status_of(server, session).running  # before the cell ended
    finally:
        flag.touch()
    deadline = time.monotonic() + 60
    while True:
        reply = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == running:
            break
    assert reply["content"]["status"] == "ok"


def test_the_running_comm_gives_a_running_cell_its_outputs_so_far_then_its_end(
        kernel: Kernel, session: str) -> None:
    """As a notebook reopened while a cell runs: on a subshell (the main shell waits for the
    cell), the cell's id, request and outputs so far; its live outputs carry their seq; then its
    end with its execution count."""
    client = kernel.client
    comm = _open_comm(kernel, "llfabric.running", {})
    assert _comm_data(kernel, comm, lambda d: "running" in d) == {"running": None}  # idle
    kernel.execute("x = 1")
    client.control_channel.send(client.session.msg("create_subshell_request", {}))
    subshell = client.get_control_msg(timeout=30)["content"]["subshell_id"]
    request = client.session.msg("execute_request", {
        "code": "import time\nfor i in range(12):\n    print('line', i, flush=True)\n"
                "    time.sleep(0.3)", "silent": False, "store_history": True,
        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        metadata={"cellId": "the-cell"})
    client.shell_channel.send(request)
    msg_id = request["header"]["msg_id"]
    live: list[dict] = []
    deadline = time.monotonic() + 60
    while "line 2" not in "".join(m["content"]["text"] for m in live):
        assert time.monotonic() < deadline, "the cell printed nothing"
        try:
            msg = client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
            live.append(msg)
    assert [m["metadata"]["llfabric_seq"] for m in live] == list(range(len(live)))
    comm = uuid.uuid4().hex
    _on_subshell(kernel, "comm_open", {"comm_id": comm, "target_name": "llfabric.running",
                                       "data": {}}, subshell)
    texts: dict[int, str] = {}
    running = done = None
    deadline = time.monotonic() + 60
    while done is None:
        assert time.monotonic() < deadline, "the cell did not end"
        try:
            msg = client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        content = msg["content"]
        if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
            texts[msg["metadata"]["llfabric_seq"]] = content["text"]
        elif msg["msg_type"] == "comm_msg" and content["comm_id"] == comm:
            if "running" in content["data"]:
                running = content["data"]["running"]
            else:
                done = content["data"]["done"]
    assert running is not None, "the comm said nothing before the cell's end"
    assert running["cell_id"] == "the-cell" and running["msg_id"] == msg_id
    assert running["execution_count"] == 2 and not running["dropped"]
    assert "line 2" in "".join(o["content"]["text"] for o in running["outputs"])
    assert "line 11" not in "".join(o["content"]["text"] for o in running["outputs"])
    shown = {o["seq"]: o["content"]["text"] for o in running["outputs"]}
    shown.update((seq, text) for seq, text in texts.items() if seq >= running["next"])
    assert "".join(shown[seq] for seq in sorted(shown)) == \
        "".join(f"line {i}\n" for i in range(12))
    assert done == {"msg_id": msg_id, "cell_id": "the-cell", "execution_count": 2,
                    "status": "ok"}

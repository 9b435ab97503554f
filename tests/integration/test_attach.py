"""Attached ipykernels against a real server: cells run on the fabric, outputs come back through
the kernel's channels as a frontend expects them."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import nbformat
import pytest
from attached import Kernel, kernel_env, text_of
from click.testing import CliRunner
from helpers import RunningServer, execute, hold_a_slot, serving, start_server
from jupyter_client.kernelspec import KernelSpecManager

from cli.main import main as cli
from fabric.attach.notebook_file import META
from fabric.errors import RemoteError
from fabric.messages import Reply
from fabric.snapshot import Store


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # One execution slot, so that a cell of another session makes a kernel's cell queue; no
    # worker kept warm after a cell, so that a prepared worker shows that a draft arrived.
    with serving(tmp_path_factory.mktemp("store"), slots=1, keep_warm=0) as running:
        yield running


@pytest.fixture
def session() -> str:
    return f"k-{uuid.uuid4().hex[:10]}"


def _session_status(server: RunningServer, session: str) -> dict:
    with server.client() as client:
        status = client.status()
    return next(s for s in status.sessions if s.session == session).to_map() | {
        "leases_held": status.leases.held}


def _results(outputs: list[dict]) -> list[dict]:
    return [m["content"] for m in outputs if m["msg_type"] == "execute_result"]


def test_state_lives_on_the_fabric_not_in_the_kernel(kernel: Kernel, server: RunningServer,
                                                     session: str) -> None:
    reply, _ = kernel.execute("x = 41\nprint('set')")
    assert reply["status"] == "ok"
    assert _session_status(server, session)["leases_held"] == 0  # no lease between cells
    reply, outputs = kernel.execute("x + 1")
    [result] = _results(outputs)
    assert result["data"]["text/plain"] == "42"
    assert result["execution_count"] == reply["execution_count"] == 2
    _, outputs = kernel.execute("%%local\n'x' in globals()")
    assert _results(outputs)[0]["data"]["text/plain"] == "False"
    status = _session_status(server, session)
    # `x + 1` changed nothing: the session's version is the first cell's
    assert status["version"] == 1 and status["leases_held"] == 0


def test_rich_outputs_keep_their_mime_types(kernel: Kernel) -> None:
    reply, outputs = kernel.execute(
        "from IPython.display import HTML, JSON, display\n"
        "handle = display(HTML('<b>first</b>'), display_id=True)\n"
        "display(JSON({'a': 1}))\n"
        "handle.update(HTML('<i>second</i>'))\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3])\n"
        "plt.show()\n"
        "print('to stderr', file=__import__('sys').stderr)")
    assert reply["status"] == "ok", reply
    by_type: dict[str, list[dict]] = {}
    for m in outputs:
        by_type.setdefault(m["msg_type"], []).append(m["content"])
    first, js, png = by_type["display_data"]
    assert first["data"]["text/html"] == "<b>first</b>"
    assert js["data"]["application/json"] == {"a": 1}
    assert "image/png" in png["data"]
    [update] = by_type["update_display_data"]
    assert update["data"]["text/html"] == "<i>second</i>"
    assert update["transient"]["display_id"] == first["transient"]["display_id"]
    assert text_of(outputs, "stderr") == "to stderr\n"


def test_what_the_worker_pages_reaches_the_pager(kernel: Kernel) -> None:
    reply, outputs = kernel.execute("len?")
    assert reply["status"] == "ok" and outputs == []
    [page] = reply["payload"]
    assert page["source"] == "page" and "Return the number" in page["data"]["text/plain"]


def test_an_exception_arrives_with_its_traceback(kernel: Kernel) -> None:
    reply, outputs = kernel.execute("def f():\n    return 1 / 0\nf()")
    [error] = [m["content"] for m in outputs if m["msg_type"] == "error"]
    assert error["ename"] == "ZeroDivisionError"
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in error["traceback"]]  # colours
    assert any("return 1 / 0" in line for line in lines)
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    assert reply["traceback"] == error["traceback"]
    reply, outputs = kernel.execute("f")  # the failed cell's definition was kept
    assert reply["status"] == "ok" and "function" in _results(outputs)[0]["data"]["text/plain"]


def test_interrupt_stops_the_cell_and_the_session_goes_on(kernel: Kernel) -> None:
    kernel.execute("n = 7")

    def interrupt_once_running(msg: dict) -> None:
        if msg["msg_type"] == "stream" and "sleeping" in msg["content"]["text"]:
            kernel.manager.interrupt_kernel()

    reply, outputs = kernel.execute("import time\nn = 8\nprint('sleeping', flush=True)\n"
                                    "time.sleep(60)", on_output=interrupt_once_running,
                                    timeout=50)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert any(m["msg_type"] == "error" for m in outputs)
    reply, outputs = kernel.execute("n")
    # As in a kernel, what ran before the interrupt happened: n = 8 is kept.
    assert _results(outputs)[0]["data"]["text/plain"] == "8"


def test_input_and_getpass_go_through_the_stdin_channel(kernel: Kernel) -> None:
    asked = []

    def answer(request: dict) -> str:
        asked.append((request["prompt"], request["password"]))
        return "ada" if not request["password"] else "s3cret"

    reply, _ = kernel.execute("import getpass\nname = input('who? ')\n"
                              "secret = getpass.getpass('key: ')", answer=answer)
    assert reply["status"] == "ok", reply
    assert asked == [("who? ", False), ("key: ", True)]
    _, outputs = kernel.execute("print(name, len(secret))")
    assert text_of(outputs) == "ada 6\n"
    reply, outputs = kernel.execute("input()")  # a frontend without stdin: a clear error
    assert reply["status"] == "error" and reply["ename"] == "StdinNotImplementedError"


def test_restart_and_reattach_continue_from_the_store(kernel: Kernel) -> None:
    kernel.execute("y = 5")
    kernel.restart()
    reply, outputs = kernel.execute("y * 2")
    assert _results(outputs)[0]["data"]["text/plain"] == "10"
    assert reply["execution_count"] == 2  # prompt numbers continue the session's


def test_the_next_cell_of_the_notebook_is_drafted(server: RunningServer, specs: KernelSpecManager,
                                                  tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("a = 1"), nbformat.v4.new_markdown_cell("text"),
                nbformat.v4.new_code_cell("a + 1")]
    # No session given: the notebook's metadata names it, the frontend names the notebook.
    session = f"work-{uuid.uuid4().hex[:8]}"
    nb.metadata[META] = {"session": session, "path": "work.ipynb"}
    nbformat.write(nb, str(tmp_path / "work.ipynb"))
    env = kernel_env(server.address, "", JPY_SESSION_NAME="work.ipynb")
    started = Kernel.start(specs, env, tmp_path)
    try:
        started.execute("b = 2")  # no cell id: nothing to draft
        assert not _session_status(server, session)["prepared"]
        started.execute("a = 1", cell_id=nb.cells[0].id)
        assert _session_status(server, session)["prepared"]
    finally:
        started.stop()


def test_status_and_checkout_magics(kernel: Kernel) -> None:
    kernel.execute("data = list(range(1000))")
    _, outputs = kernel.execute("%llfabric status")
    status = text_of(outputs)
    assert "version 1" in status and "lease time so far" in status and "stored:" in status
    assert "hours saved vs pinned" in status
    _, outputs = kernel.execute("%llfabric tag full")  # the latest version, 1
    assert "version 1 is named full" in text_of(outputs)
    kernel.execute("data = []")
    _, outputs = kernel.execute("%llfabric checkout full")
    assert "back at version 1" in text_of(outputs)
    _, outputs = kernel.execute("len(data)")  # the state of version 1 again
    assert _results(outputs)[0]["data"]["text/plain"] == "1000"
    _, outputs = kernel.execute("%llfabric detach")
    assert "detached" in text_of(outputs)
    _, outputs = kernel.execute("'data' in globals()")  # runs locally now
    assert _results(outputs)[0]["data"]["text/plain"] == "False"


def test_the_rm_magic_removes_another_session(kernel: Kernel,
                                               server: RunningServer) -> None:
    other = f"o-{uuid.uuid4().hex[:8]}"
    with server.client() as client:
        client.call("open", session=other, cwd=tempfile.gettempdir())
        execute(client, other, "x = 1")
    kernel.execute("y = 2")
    _, outputs = kernel.execute(f"%llfabric rm {other}")
    assert f"removed session {other}" in text_of(outputs)
    assert other not in Store(server.store).sessions()
    _, outputs = kernel.execute(f"%llfabric rm {other}")
    assert "no session" in text_of(outputs, "stderr")


def test_a_waiting_cell_says_how_long_it_waits(kernel: Kernel, server: RunningServer) -> None:
    holder = hold_a_slot(server, 3)
    reply, outputs = kernel.execute("'ran'")
    holder.join()
    assert reply["status"] == "ok"
    # the wait is llfabric's news, not the notebook's: the cell shows only its result
    assert [m["msg_type"] for m in outputs] == ["execute_result"]
    _, outputs = kernel.execute("%llfabric status")
    assert "for an execution slot" in text_of(outputs)


def test_unreachable_fabric_is_said_in_the_cell(specs: KernelSpecManager, tmp_path: Path) -> None:
    env = kernel_env(f"ipc://{tmp_path}/nobody.sock", "s")
    started = Kernel.start(specs, env, tmp_path)
    try:
        reply, outputs = started.execute("1 + 1")
        [error] = [m["content"] for m in outputs if m["msg_type"] == "error"]
        assert "no llfabric server answers" in error["evalue"] and "%%local" in error["evalue"]
        assert reply["status"] == "error"
        _, outputs = started.execute("%%local\n1 + 1")
        assert _results(outputs)[0]["data"]["text/plain"] == "2"
    finally:
        started.stop()


def test_a_busy_server_is_waited_for_not_called_down(kernel: Kernel,
                                                     server: RunningServer) -> None:
    """A server that listens but answers late (stopped here for 3 s, as a loaded host's can
    be) gets the cell: only one that does not listen is unreachable."""
    os.kill(server.process.pid, signal.SIGSTOP)
    resume = threading.Timer(3.0, os.kill, (server.process.pid, signal.SIGCONT))
    resume.start()
    try:
        reply, outputs = kernel.execute("'ran'")
    finally:
        resume.join()
    assert reply["status"] == "ok", outputs
    assert _results(outputs)[0]["data"]["text/plain"] == "'ran'"


def test_cli_attaches_a_running_plain_kernel(server: RunningServer, session: str,
                                             tmp_path: Path) -> None:
    env = kernel_env(server.address, session)
    plain = Kernel.start(KernelSpecManager(), env, tmp_path, kernel_name="python3")
    try:
        result = CliRunner().invoke(cli, ["attach", plain.manager.connection_file,
                                          "--connect", server.address, "--session", session])
        assert result.exit_code == 0, result.output
        assert session in result.output
        plain.execute("z = 3")
        _, outputs = plain.execute("%%local\n'z' in globals()")
        assert _results(outputs)[0]["data"]["text/plain"] == "False"
        assert _session_status(server, session)["version"] == 1
    finally:
        plain.stop()


def test_kernelspec_install_writes_an_attaching_kernel(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["kernelspec", "install", "--prefix", str(tmp_path),
                                      "--connect", "ipc:///tmp/x.sock"])
    assert result.exit_code == 0, result.output
    spec = json.loads((tmp_path / "share/jupyter/kernels/llfabric/kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (llfabric)"
    assert "--ext=fabric.attach" in spec["argv"]
    assert spec["env"] == {"LLFABRIC_BIND": "ipc:///tmp/x.sock"}
    # the launcher shows a kernel's logo-* resource, as it shows a plain kernel's
    logo = tmp_path / "share/jupyter/kernels/llfabric/logo-svg.svg"
    assert ElementTree.parse(logo).getroot().tag == "{http://www.w3.org/2000/svg}svg"


def test_live_edits_on_the_draft_comm_prepare_a_worker(kernel: Kernel, server: RunningServer,
                                                       session: str) -> None:
    kernel.execute("w = 1")
    assert not _session_status(server, session)["prepared"]
    client = kernel.client
    client.shell_channel.send(client.session.msg("comm_open", {
        "comm_id": uuid.uuid4().hex, "target_name": "llfabric.draft",
        "data": {"source": "w + 1"}}))
    # the kernel forwards drafts from a thread of its own: the worker is prepared soon after
    deadline = time.monotonic() + 60
    while not _session_status(server, session)["prepared"]:
        assert time.monotonic() < deadline, "the draft never reached the server"
        time.sleep(0.1)


def test_a_pinned_session_says_so_in_its_status_and_log(server: RunningServer,
                                                        specs: KernelSpecManager, session: str,
                                                        tmp_path: Path) -> None:
    log = tmp_path / "kernel.log"
    kernel = Kernel.start(specs, kernel_env(server.address, session), tmp_path, log=log)
    try:
        _, outputs = kernel.execute("g = (i for i in range(3))")
        assert outputs == []  # as in a plain kernel: the notice goes to the status and the log
        _, outputs = kernel.execute("%llfabric status")
        assert "pinned:" in text_of(outputs) and "g cannot be saved" in text_of(outputs)
        _, outputs = kernel.execute("next(g)")
        assert _results(outputs)[0]["data"]["text/plain"] == "0"
    finally:
        kernel.stop()
    assert f"llfabric: session {session}: g cannot be saved" in log.read_text()


def test_an_interrupt_while_input_waits(kernel: Kernel) -> None:
    def interrupt(request: dict) -> str:
        kernel.manager.interrupt_kernel()
        time.sleep(1)  # the kernel gives up waiting before an answer could come
        return "late"

    reply, _ = kernel.execute("v = 1\nv = input('? ')", answer=interrupt, timeout=50)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    _, outputs = kernel.execute("v")
    assert _results(outputs)[0]["data"]["text/plain"] == "1"


def test_the_server_refuses_stray_answers_and_impossible_checkouts(server: RunningServer) -> None:
    name = f"s-{uuid.uuid4().hex[:8]}"
    with server.client() as client:
        client.call("open", session=name, cwd=tempfile.gettempdir())
        with pytest.raises(RemoteError, match=r"no cell of session .* is waiting for input"):
            client.call("input", session=name, value="x")
        with pytest.raises(RemoteError, match="has no versions") as caught:
            client.call("checkout", session=name, version=1)
        assert caught.value.kind == "store"
        # A client that did not offer stdin (llfabric run) gets an error in the cell, not a hang.
        reply, outputs = execute(client, name, "input('? ')")
        assert reply["status"] == "error"
        assert outputs[-1]["ename"] == "StdinNotImplementedError"


def test_a_server_restart_between_cells_is_survived(specs: KernelSpecManager, session: str,
                                                    tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:
        first = start_server(tmp_path / "store", Path(sockdir))
        started = Kernel.start(specs, kernel_env(first.address, session), tmp_path)
        try:
            started.execute("kept = 'yes'")
            first.stop()
            second = start_server(tmp_path / "store", Path(sockdir))  # same store and address
            try:
                reply, outputs = started.execute("kept")
                assert _results(outputs)[0]["data"]["text/plain"] == "'yes'"
                assert reply["execution_count"] == 2
            finally:
                second.stop()
        finally:
            started.stop()


def test_a_cell_left_running_is_reported_and_can_be_interrupted(kernel: Kernel,
                                                               server: RunningServer,
                                                               session: str) -> None:
    kernel.execute("'warm'")
    started, replies = threading.Event(), []

    def left_running() -> None:  # as a cell of a kernel that has since been restarted
        with server.client() as client:
            try:
                for message in client.execute(session, "print('go', flush=True)\n"
                                                       "import time\ntime.sleep(40)", timeout=60):
                    started.set()
                    replies.append(message.to_map() if isinstance(message, Reply) else message)
            except RemoteError as exc:
                replies.append(exc)

    runner = threading.Thread(target=left_running)
    runner.start()
    assert started.wait(60)
    _, outputs = kernel.execute("1")
    [error] = [m["content"] for m in outputs if m["msg_type"] == "error"]
    assert "already running a cell" in error["evalue"] and "%llfabric interrupt" in error["evalue"]
    _, outputs = kernel.execute("%llfabric interrupt")
    assert "interrupted the running cell" in text_of(outputs)
    runner.join(30)
    assert not runner.is_alive()
    assert replies[-1]["status"] == "error" and replies[-1]["ename"] == "KeyboardInterrupt"


def test_a_kernel_shut_down_closes_its_session(server: RunningServer, specs: KernelSpecManager,
                                               session: str, tmp_path: Path) -> None:
    started = Kernel.start(specs, kernel_env(server.address, session), tmp_path)
    started.execute("kept = 1")
    started.client.stop_channels()
    started.manager.shutdown_kernel(now=False)  # as Jupyter's "Shut Down Kernel"
    with server.client() as client:
        sessions = [s.session for s in client.status().sessions]
        assert session not in sessions  # no worker stays prepared for it
        client.call("open", session=session, cwd=str(tmp_path))
        assert execute(client, session, "kept")[1][0]["data"]["text/plain"] == "1"


def test_a_server_that_stops_answering_mid_cell_is_reported(specs: KernelSpecManager,
                                                            session: str,
                                                            tmp_path: Path) -> None:
    with serving(tmp_path / "store") as frozen:
        started = Kernel.start(specs, kernel_env(frozen.address, session), tmp_path)
        try:
            # The kernel's patience, shortened in the kernel itself (a local cell).
            started.execute("%%local\nimport fabric.attach.relay\n"
                            "fabric.attach.relay.SILENCE = 1.0")

            def freeze(msg: dict) -> None:
                if msg["msg_type"] == "stream" and "go" in msg["content"]["text"]:
                    os.kill(frozen.process.pid, signal.SIGSTOP)

            reply, outputs = started.execute("import time\nprint('go', flush=True)\n"
                                             "time.sleep(30)", on_output=freeze, timeout=25)
            [error] = [m["content"] for m in outputs if m["msg_type"] == "error"]
            assert "stopped answering while the cell ran" in error["evalue"]
            assert reply["status"] == "error"
        finally:
            os.kill(frozen.process.pid, signal.SIGCONT)
            started.stop()

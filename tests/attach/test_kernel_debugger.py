"""JupyterLab's debugger on an attached kernel: the debug protocol driven as JupyterLab drives
it (on the control channel, events on IOPub) against a real server, whose workers run the cells
under debugpy; a breakpoint stops the cell in its worker, the stopped frame's variables are read,
and the cell finishes once continued."""

from __future__ import annotations

import itertools
import queue
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from attached import Kernel, install_test_kernelspec, kernel_env, text_of
from helpers import RunningServer, serving
from jupyter_client.kernelspec import KernelSpecManager

from fabric.worker import cellfiles

CELL = "a = 41\nb = a + 1\nprint('b is', b)\n"
_seq = itertools.count(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), keep_warm=600) as running:
        yield running


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory, server: RunningServer) -> Iterator[Kernel]:
    specs: KernelSpecManager = install_test_kernelspec(tmp_path_factory.mktemp("jupyter"))
    session = f"d-{uuid.uuid4().hex[:10]}"
    kernel = Kernel.start(specs, kernel_env(server.address, session),
                          tmp_path_factory.mktemp("cwd"))
    kernel.session = session
    yield kernel
    kernel.stop()


def start_debugging(kernel: Kernel, cell: str, line: int) -> str:
    """Start the debugger as JupyterLab does, with a breakpoint at `line` of `cell`; the cell's
    file."""
    debug(kernel, "initialize", clientID="jupyterlab", adapterID="python", pathFormat="path",
          linesStartAt1=True, columnsStartAt1=True)
    debug(kernel, "attach")
    path = debug(kernel, "dumpCell", code=cell)["body"]["sourcePath"]
    debug(kernel, "setBreakpoints", source={"path": path}, breakpoints=[{"line": line}])
    debug(kernel, "configurationDone")
    return path


def debug(kernel: Kernel, command: str, **arguments: object) -> dict:
    """The debug_reply content of a debug_request, as JupyterLab sends them."""
    client = kernel.client
    message = client.session.msg("debug_request", {
        "type": "request", "seq": next(_seq), "command": command, "arguments": arguments})
    client.control_channel.send(message)
    while True:
        reply = client.get_control_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == message["header"]["msg_id"]:
            content = reply["content"]
            assert content["request_seq"] == message["content"]["seq"]
            assert content["success"], content
            return content


def debug_event(kernel: Kernel, event: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = kernel.client.get_iopub_msg(timeout=left)
        except queue.Empty:
            break
        if message["msg_type"] == "debug_event" and message["content"]["event"] == event:
            return message["content"]
    raise AssertionError(f"no {event!r} debug event within {timeout} s")


def finished(kernel: Kernel, msg_id: str) -> dict:
    while True:
        reply = kernel.client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


def stopped_value(kernel: Kernel, name: str) -> tuple[dict, str]:
    """The top frame of the stopped cell, and the value of `name` in its scopes."""
    thread = debug_event(kernel, "stopped")["body"]["threadId"]
    frames = debug(kernel, "stackTrace", threadId=thread)["body"]["stackFrames"]
    top = frames[0]
    for scope in debug(kernel, "scopes", frameId=top["id"])["body"]["scopes"]:
        variables = debug(kernel, "variables",
                          variablesReference=scope["variablesReference"])["body"]["variables"]
        values = {v["name"]: v["value"] for v in variables}
        if name in values:
            return top, values[name]
    raise AssertionError(f"{name} is in no scope of the stopped frame")


def worker_tracing(kernel: Kernel) -> tuple[str, bool]:
    """The worker that runs the next cell, and whether it traces the cell (for a debugger)."""
    pid, on = text_of(kernel.execute(
        "import os, sys\nprint(os.getpid(), sys.gettrace() is not None)")[1]).split()
    return pid, on == "True"


def test_a_breakpoint_stops_the_cell_in_its_worker_and_shows_its_variables(
        kernel: Kernel) -> None:
    kernel.execute("x = 1")  # the session opens, and a worker kept for the next cell
    assert debug(kernel, "initialize", clientID="jupyterlab", adapterID="python",
                 pathFormat="path", linesStartAt1=True,
                 columnsStartAt1=True)["body"]["supportsConfigurationDoneRequest"]
    debug(kernel, "attach")
    info = debug(kernel, "debugInfo")["body"]
    assert info["isStarted"] and info["hashMethod"] == "Murmur2"
    path = debug(kernel, "dumpCell", code=CELL)["body"]["sourcePath"]
    # the name JupyterLab computes for the cell from what debugInfo said
    assert path == f"{info['tmpFilePrefix']}{cellfiles.murmur2(CELL, info['hashSeed'])}" \
                   f"{info['tmpFileSuffix']}"
    assert Path(path).read_text() == CELL
    placed = debug(kernel, "setBreakpoints", source={"path": path},
                   breakpoints=[{"line": 2}], sourceModified=False)["body"]["breakpoints"]
    assert [b["line"] for b in placed] == [2] and placed[0]["verified"]
    debug(kernel, "configurationDone")
    assert debug(kernel, "debugInfo")["body"]["breakpoints"] == [
        {"source": path, "breakpoints": [{"line": 2}]}]

    for _ in range(2):  # a second cell connects to its worker again, with the breakpoints
        msg_id = kernel.client.execute(CELL)
        top, value = stopped_value(kernel, "a")
        assert (top["source"]["path"], top["line"], value) == (path, 2, "41")
        thread = debug(kernel, "debugInfo")["body"]["stoppedThreads"][0]
        debug(kernel, "next", threadId=thread)  # a step: line 2 runs
        top, value = stopped_value(kernel, "b")
        assert (top["line"], value) == (3, "42")
        debug(kernel, "continue", threadId=thread)
        assert finished(kernel, msg_id)["status"] == "ok"
    reply, outputs = kernel.execute("print(b)")  # what the debugged cell bound is committed
    assert text_of(outputs) == "42\n"
    # between cells the variables panel lists the session's values, as a plain kernel's does
    listed = {v["name"]: (v["value"], v["type"])
              for v in debug(kernel, "inspectVariables")["body"]["variables"]}
    assert listed["a"] == ("41", "int") and listed["b"] == ("42", "int")

    traced, on = worker_tracing(kernel)
    assert on
    # disconnecting (the debugger switched off) forgets the breakpoints: the cell runs through
    debug(kernel, "disconnect", restart=False, terminateDebuggee=False)
    assert not debug(kernel, "debugInfo")["body"]["isStarted"]
    reply, outputs = kernel.execute(CELL)
    assert reply["status"] == "ok"
    assert text_of(outputs) == "b is 42\n"
    # and the worker that was debugged runs cells untraced again, at full speed
    assert worker_tracing(kernel) == (traced, False)


def test_an_interrupt_ends_a_cell_stopped_at_a_breakpoint(kernel: Kernel) -> None:
    cell = "c = 1\nc += 1\n"
    start_debugging(kernel, cell, 2)
    msg_id = kernel.client.execute(cell)
    debug_event(kernel, "stopped")
    kernel.manager.interrupt_kernel()
    reply = finished(kernel, msg_id)
    assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt")
    debug(kernel, "disconnect")
    reply, outputs = kernel.execute("print(c)")  # as a plain kernel: the line before ran
    assert text_of(outputs) == "1\n"


def test_stop_ends_a_cell_stopped_at_a_breakpoint(kernel: Kernel, server: RunningServer
                                                  ) -> None:
    cell = "d = 1\nd += 1\n"
    start_debugging(kernel, cell, 2)
    msg_id = kernel.client.execute(cell)
    debug_event(kernel, "stopped")
    with server.client() as side:
        assert side.stop(kernel.session)  # its worker killed
    assert finished(kernel, msg_id)["status"] == "error"
    assert debug_event(kernel, "continued")  # the frontend no longer shows it stopped
    assert not debug(kernel, "debugInfo")["body"]["stoppedThreads"]
    msg_id = kernel.client.execute(cell)  # the next cell's fresh worker stops again
    debug_event(kernel, "stopped")
    debug(kernel, "continue", threadId=0)
    assert finished(kernel, msg_id)["status"] == "ok"
    debug(kernel, "disconnect")


def test_an_exception_filter_stops_the_cell_where_it_raises(kernel: Kernel) -> None:
    cell = "try:\n    1 / 0\nexcept ZeroDivisionError:\n    caught = True\n"
    start_debugging(kernel, cell, 4)
    debug(kernel, "setBreakpoints", source={"path": cellfiles.path(cell)}, breakpoints=[])
    debug(kernel, "setExceptionBreakpoints", filters=["raised"])
    msg_id = kernel.client.execute(cell)
    stopped = debug_event(kernel, "stopped")["body"]
    assert stopped["reason"] == "exception"
    thread = stopped["threadId"]
    assert debug(kernel, "exceptionInfo", threadId=thread)["body"]["exceptionId"].endswith(
        "ZeroDivisionError")
    debug(kernel, "continue", threadId=thread)
    assert finished(kernel, msg_id)["status"] == "ok"
    debug(kernel, "disconnect")


@pytest.mark.parametrize("content, why", [
    ({"type": "request", "seq": 1, "command": 5}, "a command and arguments"),
    ({"type": "request", "seq": 1, "command": "dumpCell", "arguments": {"code": 1}}, "code"),
    ({"type": "request", "seq": 1, "command": "setBreakpoints", "arguments": {}}, "source"),
    ({"type": "request", "seq": 1, "command": "stackTrace", "arguments": {"threadId": 1}},
     "no cell of the session is running"),
])
def test_a_debug_request_it_cannot_serve_is_answered_as_failed(kernel: Kernel,
                                                               server: RunningServer,
                                                               content: dict, why: str) -> None:
    with server.client() as client:
        answer = client.call("debug", session=kernel.session, content=content).content
    assert not answer["success"] and why in answer["message"]
    assert answer["request_seq"] == 1

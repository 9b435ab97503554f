"""An attached kernel answers completion, inspection and history as a plain ipykernel does, from
the session's state (its live worker, else its head's catalog) and the session's own cells;
`?` and `%load` come back as the execute reply's payloads. Each row is checked against a plain
ipykernel given the same cells."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from attached import Kernel, install_test_kernelspec, kernel_env, text_of
from helpers import RunningServer, serving
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from fabric import protocol
from fabric.messages import Delivered

SETUP = ("class Thing:\n"
         "    '''A thing with methods.'''\n"
         "    def method_one(self, a, b=2):\n"
         "        '''Add b to a.'''\n"
         "        return a + b\n"
         "my_unique_var = {'alpha': 1}\n"
         "thing = Thing()\n")


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    return install_test_kernelspec(tmp_path_factory.mktemp("jupyter"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """A plain ipykernel that ran SETUP: what every answer is compared with."""
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path_factory.mktemp("plain")))
    kernel = Kernel(manager)
    kernel.execute(SETUP)
    yield kernel
    kernel.stop()


@pytest.fixture(scope="module", params=["warm", "cold"])
def fabric(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           specs: KernelSpecManager) -> Iterator[Kernel]:
    """An attached kernel that ran SETUP: warm, its worker kept; cold, none kept, so that
    the head's catalog answers."""
    keep = 600 if request.param == "warm" else 0
    with serving(tmp_path_factory.mktemp("store"), keep_warm=keep) as server:
        session = f"r-{uuid.uuid4().hex[:10]}"
        kernel = Kernel.start(specs, kernel_env(server.address, session),
                              tmp_path_factory.mktemp("cwd"))
        reply, _ = kernel.execute(SETUP)
        assert reply["status"] == "ok"
        with server.client() as client:
            status = client.status()
        tier = next(s for s in status.sessions if s.session == session).tier
        assert tier == request.param
        kernel.tier = tier
        if tier == "warm":  # the worker's first completion readies its completer (jedi):
            deadline = time.monotonic() + 120  # until then the catalog answers, without keys
            while not _complete(kernel, "my_unique_var['al")["matches"]:
                assert time.monotonic() < deadline, "the warm worker never answered"
                time.sleep(0.5)
        yield kernel
        kernel.stop()


def _complete(kernel: Kernel, code: str) -> dict:
    return kernel.client.complete(code, len(code), reply=True, timeout=30)["content"]


def _inspect(kernel: Kernel, code: str, detail: int = 0) -> dict:
    return kernel.client.inspect(code, len(code), detail, reply=True, timeout=30)["content"]


@pytest.mark.parametrize(("code", "expected", "cold_too"), [
    ("my_uni", "my_unique_var", True), ("x = my_uni", "my_unique_var", True),
    ("thing.meth", "method_one", True), ("my_unique_var.ke", "keys", True),
    ("pri", "print", True),
    # a catalog knows a name's attributes, not its keys nor its attributes' attributes
    ("my_unique_var['al", "alpha", False), ("thing.method_one.__doc__.upp", "upper", False),
])
def test_completion_of_session_variables(fabric: Kernel, plain: Kernel, code: str,
                                         expected: str, cold_too: bool) -> None:
    theirs = _complete(plain, code)
    assert expected in theirs["matches"]
    if fabric.tier == "cold" and not cold_too:
        return
    mine = _complete(fabric, code)
    assert expected in mine["matches"]
    assert (mine["cursor_start"], mine["cursor_end"]) == (theirs["cursor_start"],
                                                          theirs["cursor_end"])


@pytest.mark.parametrize("code", ["thing", "thing.method_one(", "my_unique_var", "Thing"])
def test_inspection_of_session_variables(fabric: Kernel, plain: Kernel, code: str) -> None:
    mine, theirs = _inspect(fabric, code), _inspect(plain, code)
    assert theirs["found"] and mine["found"]
    assert mine["status"] == "ok" and set(mine["data"]) <= set(theirs["data"]) | {"text/plain"}


def test_inspection_shows_what_a_plain_kernel_shows(fabric: Kernel) -> None:
    assert "Add b to a" in _inspect(fabric, "thing.method_one(")["data"]["text/plain"]
    assert "A thing with methods" in _inspect(fabric, "thing")["data"]["text/plain"]
    assert "alpha" in _inspect(fabric, "my_unique_var")["data"]["text/plain"]


def test_unknown_names_are_not_found(fabric: Kernel, plain: Kernel) -> None:
    assert not _inspect(fabric, "no_such_name")["found"]
    assert not _inspect(plain, "no_such_name")["found"]
    assert _complete(fabric, "no_such_na")["matches"] == _complete(plain, "no_such_na")["matches"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), keep_warm=0) as running:
        yield running


@pytest.fixture
def fresh(server: RunningServer, specs: KernelSpecManager, tmp_path: Path) -> Iterator[Kernel]:
    """An attached kernel of a new session, in `tmp_path`."""
    session = f"h-{uuid.uuid4().hex[:10]}"
    kernel = Kernel.start(specs, kernel_env(server.address, session), tmp_path)
    kernel.session = session
    yield kernel
    kernel.stop()


@pytest.fixture
def fresh_plain(tmp_path: Path) -> Iterator[Kernel]:
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path))
    kernel = Kernel(manager)
    yield kernel
    kernel.stop()


CELLS = ["a = 1", "b = a + 1", "print(b)"]


def _history(kernel: Kernel, **request: object) -> list[list]:
    reply = kernel.client.history(raw=True, output=False, reply=True, timeout=30, **request)
    return [list(entry) for entry in reply["content"]["history"]]


def test_history_is_the_sessions_cells_across_restarts(fresh: Kernel, server: RunningServer,
                                                      specs: KernelSpecManager,
                                                      tmp_path: Path) -> None:
    other = Kernel.start(specs, kernel_env(server.address, f"o-{uuid.uuid4().hex[:10]}"),
                         tmp_path)
    try:
        other.execute("another_sessions_cell = 1")
    finally:
        other.stop()
    for cell in CELLS:
        fresh.execute(cell)
    for _ in range(2):  # and again after a restart: the history comes from the store
        tail = _history(fresh, hist_access_type="tail", n=3)
        assert [entry[2] for entry in tail] == CELLS
        assert [entry[1] for entry in tail] == [1, 2, 3]
        session = tail[0][0]
        [entry] = _history(fresh, hist_access_type="range", session=session, start=2, stop=3)
        assert entry[1:] == [2, CELLS[1]]
        assert [e[2] for e in _history(fresh, hist_access_type="search", pattern="*a*")] \
            == CELLS[:2]
        fresh.restart()
    _, outputs = fresh.execute("%history -l 2")
    assert text_of(outputs) == "b = a + 1\nprint(b)\n"


def test_history_magic_prints_what_a_plain_kernel_prints(fresh: Kernel,
                                                         fresh_plain: Kernel) -> None:
    for cell in CELLS:
        fresh.execute(cell)
        fresh_plain.execute(cell)
    for magic in ("%history -l 2", "%history -n 1-2"):
        assert text_of(fresh.execute(magic)[1]) == text_of(fresh_plain.execute(magic)[1])


def _payloads(kernel: Kernel, code: str) -> list[dict]:
    reply, _ = kernel.execute(code)
    assert reply["status"] == "ok"
    return reply["payload"]


def test_pager_and_next_input_payloads(fresh: Kernel, fresh_plain: Kernel,
                                       tmp_path: Path) -> None:
    (tmp_path / "snippet.py").write_text("loaded = 42\n")
    for code, source in (("zip?", "page"), ("zip??", "page"), ("%load snippet.py",
                                                                "set_next_input")):
        mine, theirs = _payloads(fresh, code), _payloads(fresh_plain, code)
        assert [p["source"] for p in mine] == [p["source"] for p in theirs] == [source], code
        if source == "page":
            assert "zip" in mine[0]["data"]["text/plain"]
        else:
            assert mine[0]["text"] == theirs[0]["text"]
    for kernel in (fresh, fresh_plain):
        kernel.execute("recalled = 7")
    mine, theirs = _payloads(fresh, "%recall 4"), _payloads(fresh_plain, "%recall 4")
    assert mine == theirs and "recalled = 7" in mine[0]["text"]
    assert _payloads(fresh, "x = 1") == []  # a cell leaves no payload for the next


def _raw(server: RunningServer, request: dict) -> dict:
    """What the server answers a frame the client library would not send."""
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(server.address)
    try:
        socket.send(protocol.pack({"msg_id": "m", **request}))
        while True:
            assert socket.poll(30_000), "no answer"
            answer = protocol.unpack(socket.recv())
            if answer.get("type") != "heartbeat":
                return answer
    finally:
        socket.close()
        context.term()


def test_bad_questions_get_clear_answers_and_the_server_serves_on(server: RunningServer,
                                                                  fresh: Kernel) -> None:
    fresh.execute(SETUP)
    question = {"op": "complete", "session": fresh.session, "source": "my_uni", "cursor": 6}
    for bad, why in (({"cursor": "3"}, "'cursor' must be an integer"),
                     ({"op": "inspect", "detail": 1.5}, "'detail' must be an integer"),
                     ({"source": None}, "'source' must be a string"),
                     ({"session": "never-opened"}, "no open session")):
        answer = _raw(server, {**question, **bad})
        assert answer["type"] == "error" and why in answer["error"]["message"], answer
    assert "no session" in _raw(server, {"op": "history", "session": "never-opened"})[
        "error"]["message"]
    with server.client() as client:  # opened, nothing run yet: a history, empty
        client.open("opened-only")
        assert client.call("history", session="opened-only").cells == ()
    assert "comm_msg or comm_close" in _raw(server, {
        "op": "comm", "session": fresh.session, "msg_type": "comm_open", "content": {}})[
        "error"]["message"]
    with server.client() as client:
        for cursor in (-5, 10**9):  # past either end: the nearest end
            assert client.call("complete", session=fresh.session, source="my_uni",
                               cursor=cursor).status == "ok"
        assert client.call("inspect", session=fresh.session, source="thing", cursor=2,
                           detail=7).found
        # no worker is kept here: a widget's message has nowhere to go, and says so
        assert client.call("comm", session=fresh.session, msg_type="comm_msg",
                           content={"comm_id": "gone", "data": {}}) == Delivered(False)
        assert client.call("ping").pong


def _comm_flow(outputs: list[dict]) -> list[tuple]:
    """The comm messages and widget views of a cell, as a frontend meets them."""
    flow = []
    for message in outputs:
        kind, content = message["msg_type"], message["content"]
        if kind.startswith("comm_"):
            flow.append((kind, content.get("target_name"),
                         sorted((content.get("data") or {}).get("state", {}))))
        elif "application/vnd.jupyter.widget-view+json" in content.get("data", {}):
            flow.append((kind, "view"))
    return flow


def test_widgets_reach_the_frontend_with_their_comms(fresh: Kernel, fresh_plain: Kernel) -> None:
    for code in ("import ipywidgets as w\nslider = w.IntSlider(value=3)\nslider",
                 "from tqdm.notebook import tqdm\nfor _ in tqdm(range(3)):\n    pass"):
        mine, theirs = fresh.execute(code), fresh_plain.execute(code)
        assert mine[0]["status"] == theirs[0]["status"] == "ok"
        assert _comm_flow(mine[1]) == _comm_flow(theirs[1]) and _comm_flow(mine[1]), code
    [view] = [m for m in mine[1] if m["msg_type"] == "display_data"]
    model = view["content"]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert model in {m["content"]["comm_id"] for m in mine[1] if m["msg_type"] == "comm_open"}


@pytest.fixture(scope="module")
def warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), keep_warm=600) as running:
        yield running


SLIDER = ("import ipywidgets as w\n"
          "slider = w.IntSlider(value=3)\n"
          "slider.observe(lambda change: print('moved to', change['new']), 'value')\n"
          "slider")


def _send_comm(kernel: Kernel, content: dict) -> list[dict]:
    """A frontend's comm_msg; the IOPub messages the kernel sends for it, until idle."""
    message = kernel.client.session.msg("comm_msg", content)
    kernel.client.shell_channel.send(message)
    outputs = []
    while True:
        msg = kernel.client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != message["header"]["msg_id"]:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return outputs
        if msg["msg_type"] != "status":
            outputs.append(msg)


def test_a_slider_moved_in_the_frontend_moves_the_workers_slider(
        warm_server: RunningServer, specs: KernelSpecManager, fresh_plain: Kernel,
        tmp_path: Path) -> None:
    kernel = Kernel.start(specs, kernel_env(warm_server.address, f"w-{uuid.uuid4().hex[:10]}"),
                          tmp_path)
    try:
        seen = []
        for each in (kernel, fresh_plain):
            reply, outputs = each.execute(SLIDER)
            assert reply["status"] == "ok"
            [model] = [m["content"]["comm_id"] for m in outputs if m["msg_type"] == "comm_open"
                       and m["content"]["data"]["state"]["_model_name"] == "IntSliderModel"]
            moved = _send_comm(each, {"comm_id": model, "data": {
                "method": "update", "state": {"value": 7}, "buffer_paths": []}})
            _, printed = each.execute("print(slider.value)")
            seen.append((text_of(moved), text_of(printed)))
        assert seen[0] == seen[1] == ("moved to 7\n", "7\n")
    finally:
        kernel.stop()



def _traceback(outputs: list[dict]) -> str:
    return "".join(line for m in outputs if m["msg_type"] == "error"
                   for line in m["content"]["traceback"])


def test_tracebacks_and_help_in_a_plain_kernels_colours(fresh: Kernel,
                                                        fresh_plain: Kernel) -> None:
    code = "def f(n):\n    return 1 / n\nf(0)"
    mine, theirs = _traceback(fresh.execute(code)[1]), _traceback(fresh_plain.execute(code)[1])
    assert "\x1b[" in theirs and "\x1b[" in mine  # ANSI colours
    assert "ZeroDivisionError" in mine
    [help_mine], [help_theirs] = _payloads(fresh, "zip?"), _payloads(fresh_plain, "zip?")
    assert "\x1b[" in help_theirs["data"]["text/plain"]
    assert help_mine["data"]["text/plain"] == help_theirs["data"]["text/plain"]


INTERACT = ("from ipywidgets import interact\n"
            "def show(n):\n"
            "    print('n is', n)\n"
            "shown = interact(show, n=5)")


def _captured(outputs: list[dict]) -> list[tuple[str, str]]:
    """An output widget's capture around what is printed: its msg_id set to the request's
    ("request"), then cleared (""), as the frontend routes outputs by it."""
    request = outputs[0]["parent_header"]["msg_id"]
    flow = []
    for message in outputs:
        state = (message["content"].get("data") or {}).get("state") or {}
        if message["msg_type"] == "comm_msg" and "msg_id" in state:
            flow.append(("capture", "request" if state["msg_id"] == request else state["msg_id"]))
        elif message["msg_type"] == "stream":
            assert message["parent_header"]["msg_id"] == request
            flow.append(("stream", message["content"]["text"]))
    return flow


def test_an_output_widget_captures_what_its_callbacks_print(
        warm_server: RunningServer, specs: KernelSpecManager, fresh_plain: Kernel,
        tmp_path: Path) -> None:
    kernel = Kernel.start(specs, kernel_env(warm_server.address, f"i-{uuid.uuid4().hex[:10]}"),
                          tmp_path)
    try:
        seen = []
        for each in (kernel, fresh_plain):
            reply, outputs = each.execute(INTERACT)
            assert reply["status"] == "ok"
            [slider] = [m["content"]["comm_id"] for m in outputs if m["msg_type"] == "comm_open"
                        and m["content"]["data"]["state"]["_model_name"] == "IntSliderModel"]
            moved = _send_comm(each, {"comm_id": slider, "data": {
                "method": "update", "state": {"value": 7}, "buffer_paths": []}})
            seen.append((_captured(outputs), _captured(moved)))
        assert seen[0] == seen[1]
        assert ("stream", "n is 7\n") in seen[0][1] and seen[0][1][0] == ("capture", "request")
    finally:
        kernel.stop()

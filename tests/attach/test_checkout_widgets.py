"""After a checkout, the widgets a frontend shows agree with the session: those of the state
before it, whose worker is no longer the session's, are closed in the frontend (comm_close, as
`widget.close()` in a plain kernel), and the user is told which cells showed them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from attached import Kernel, install_test_kernelspec, kernel_env, text_of
from helpers import RunningServer, serving
from jupyter_client.kernelspec import KernelSpecManager

SLIDER = "import ipywidgets as w\nslider = w.IntSlider()\nslider"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), keep_warm=600) as running:
        yield running


@pytest.fixture
def kernel(server: RunningServer, tmp_path: Path) -> Iterator[Kernel]:
    specs: KernelSpecManager = install_test_kernelspec(tmp_path / "jupyter")
    kernel = Kernel.start(specs, kernel_env(server.address, f"cw-{uuid.uuid4().hex[:10]}"),
                          tmp_path)
    yield kernel
    kernel.stop()


def _widgets(kernel: Kernel, code: str) -> set[str]:
    """Run `code`; the ids of the widget models it opened."""
    reply, outputs = kernel.execute(code)
    assert reply["status"] == "ok", outputs
    return {m["content"]["comm_id"] for m in outputs if m["msg_type"] == "comm_open"}


def _move(kernel: Kernel, models: set[str], value: int) -> None:
    """The frontend moves the slider among `models`, as a user's drag does."""
    client = kernel.client
    for model in models:
        client.shell_channel.send(client.session.msg("comm_msg", {"comm_id": model, "data": {
            "method": "update", "state": {"value": value}, "buffer_paths": []}}))


def _closed(outputs: list[dict]) -> set[str]:
    return {m["content"]["comm_id"] for m in outputs if m["msg_type"] == "comm_close"}


def test_a_checkout_closes_the_widgets_of_the_state_before_it(kernel: Kernel) -> None:
    models = _widgets(kernel, SLIDER)  # [1], version 1
    assert models
    kernel.execute("x = 1")  # [2], version 2
    _move(kernel, models, 7)
    assert text_of(kernel.execute("print(slider.value)")[1]) == "7\n"  # [3], version 3
    reply, outputs = kernel.execute("%llfabric checkout 2")
    assert reply["status"] == "ok"
    assert _closed(outputs) == models  # no view left showing 7
    assert "cell [1] held the values from before the checkout" in text_of(outputs, "stderr")
    # what the session has now: the slider as cell [1] made it
    assert text_of(kernel.execute("print(slider.value)")[1]) == "0\n"


def test_a_checkout_from_the_history_panel_closes_them_and_says_so(kernel: Kernel) -> None:
    models = _widgets(kernel, SLIDER)  # [1], version 1
    client = kernel.client
    comm = uuid.uuid4().hex
    client.shell_channel.send(client.session.msg("comm_open", {
        "comm_id": comm, "target_name": "llfabric.history", "data": {"op": "list"}}))
    client.shell_channel.send(client.session.msg("comm_msg", {
        "comm_id": comm, "data": {"op": "checkout", "version": 0}}))
    closed: set[str] = set()
    while True:
        msg = client.get_iopub_msg(timeout=60)
        content = msg["content"]
        if msg["msg_type"] == "comm_close":
            closed.add(content["comm_id"])
        elif msg["msg_type"] == "comm_msg" and content["comm_id"] == comm and \
                "checked_out" in content["data"]:
            break
    assert closed == models
    assert "cell [1] held the values" in content["data"]["warning"]

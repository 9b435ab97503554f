"""A cell outlives its client, against a real server: it runs on while no client follows it,
a client that follows it later gets all its outputs and its reply, and one nobody follows within
`detached_grace` is stopped, its slot back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    RunningServer,
    execute,
    open_session,
    printing_cell,
    serving,
    text,
    wait_until,
)

from fabric.client import Client
from fabric.errors import RemoteError
from fabric.messages import InputRequest, Output, Reply

GRACE = 2  # the server's detached_grace

LINES = 15
# prints a line per 0.2 s, then sets a variable; `started` appears in the session's directory
LONG = printing_cell(LINES)
ALL_LINES = "".join(f"line {i}\n" for i in range(LINES))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), keep_warm=0, slots=2, heartbeat=1,
                 heartbeat_timeout=2, detached_grace=GRACE) as running:
        yield running


def _running(client: Client, name: str) -> bool:
    return any(s.session == name and s.running for s in client.status().sessions)


def _follow(client: Client, name: str) -> tuple[dict, list[dict]]:
    outputs, reply = [], {}
    for message in client.follow(name, timeout=60):
        if isinstance(message, Output):
            outputs.append(message.output)
        elif isinstance(message, Reply):
            reply = message.to_map()
    return reply, outputs


def _killed_client_running(server: RunningServer, name: str, started: Path) -> None:
    """Start `LONG` in session `name` from a client process, and kill that process once the
    cell runs."""
    script = (f"from helpers import execute\nfrom fabric.client import Client\n"
              f"execute(Client({server.address!r}), {name!r}, {LONG!r})\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        wait_until(started.exists, "the long cell started")
        time.sleep(0.5)  # a few lines went to that client
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()


def test_a_killed_clients_cell_runs_on_and_a_follower_gets_all_it_printed(
        server, client, tmp_path) -> None:
    name = open_session(client, tmp_path)
    _killed_client_running(server, name, tmp_path / "started")
    # the server notices (heartbeat 1 s), within the grace
    wait_until(lambda: client.status().session(name).detached is not None,
               "the server saw its client go")
    mine = client.status().session(name)
    assert mine.running and "detached" in mine.flags
    reply, outputs = _follow(client, name)
    assert reply["status"] == "ok" and reply["followed"] is True
    assert text(outputs) == ALL_LINES  # in order, the ones before the follow and after
    assert client.status().session(name).detached is None
    assert text(execute(client, name, "print(done)")[1]) == "yes\n"


def test_a_cell_that_ended_unfollowed_keeps_its_reply_for_one_follower(server, client,
                                                                       tmp_path) -> None:
    name = open_session(client, tmp_path)
    with server.client() as first:
        events = first.execute(name, "print('before')\nx = input('? ')", stdin=True)
        assert any(isinstance(m, InputRequest) for m in events)  # it waits for an answer
    # the client closed while the cell asked: it is answered as stdin not available
    wait_until(lambda: not _running(client, name), "the cell ended", timeout=20)
    reply, outputs = _follow(client, name)
    assert reply["followed"] is True and reply["status"] == "error"
    assert "before\n" in text(outputs) and "StdinNotImplementedError" in text(outputs)
    assert _follow(client, name)[0] == {"followed": False}  # taken: nothing more to follow


def test_a_cell_nobody_follows_within_the_grace_is_stopped(server, client, tmp_path) -> None:
    name = open_session(client, tmp_path)
    forever = "import time\nopen('started', 'w').close()\nwhile True:\n    time.sleep(0.05)\n"
    with server.client() as first:
        events = first.execute(name, forever)
        wait_until((tmp_path / "started").exists, "the cell started")
        events.done = True
    gone = time.monotonic()
    wait_until(lambda: client.status().leases.held == 0, "its slot came back",
           timeout=30)
    assert time.monotonic() - gone >= GRACE - 0.5  # not at once: it had its grace
    assert not _running(client, name)
    with pytest.raises(RemoteError) as stopped:
        _follow(client, name)
    assert stopped.value.kind == "stopped" and "no other followed it" in stopped.value.message
    assert execute(client, name, "1 + 1")[0]["status"] == "ok"

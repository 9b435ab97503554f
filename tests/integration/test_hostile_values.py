"""Values whose own code, run after a cell to save and describe them, never ends: the save is
held to a time limit and stopped by an interrupt like the cell itself (escalating to a kill, its
loss reported), and describing a value runs none of its properties. Real servers, real
workers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import RunningServer, execute, execute_in_thread, serving, text

from fabric.client import Client

GRACE = 2
LIMIT = 3

# a value whose pickling never ends; it counts its starts and touches `saving` (in the
# session's folder) at each
SLOW_SAVE = """import time
class Slow:
    calls = 0
    def __reduce__(self):
        Slow.calls += 1
        open('saving', 'w').close()
        while True:
            {body}
"""

# a value whose repr, dir and attributes loop for ever, and a `shape` property that counts its
# reads: all that describing it after a cell could call
LOOPING = """class R:
    reads = 0
    def __repr__(self):
        while True:
            pass
    def __dir__(self):
        while True:
            pass
    def __getattr__(self, name):
        while True:
            pass
    @property
    def shape(self):
        R.reads += 1
        return (1,)
    dtype = 'float'
r = R()
"""
HOSTILE = {"interrupt_grace": GRACE, "save_limit": LIMIT}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), **HOSTILE) as running:
        yield running


def _interrupt_once_saving(server: RunningServer, session: str, folder: Path,
                           source: str) -> dict:
    thread, result = execute_in_thread(server, session, source)
    deadline = time.monotonic() + 60
    while not (folder / "saving").exists():
        assert time.monotonic() < deadline, "the save never began"
        time.sleep(0.05)
    with server.client() as client:
        assert client.call("interrupt", session=session).interrupted
    thread.join(60)
    assert not thread.is_alive()
    return result


def test_describing_a_value_runs_none_of_its_code_that_can_block(client: Client, session: str,
                                                                 tmp_path: Path) -> None:
    reply, _ = execute(client, session, LOOPING)
    assert reply["status"] == "ok"
    reply, outputs = execute(client, session, "r.own = 1\nprint(R.reads)")
    assert (reply["status"], text(outputs)) == ("ok", "0\n")  # no property ran after a cell
    client.call("close", session=session)  # no live worker: completion reads the catalog
    client.call("open", session=session, cwd=str(tmp_path))
    found = client.call("complete", session=session, source="r.", cursor=2)
    assert {"own", "dtype", "shape"} <= set(found.matches)


def test_a_save_past_its_limit_leaves_the_value_with_its_worker(client: Client,
                                                                session: str) -> None:
    source = SLOW_SAVE.format(body="pass") + "kept = 1\nslow = Slow()"
    reply, _ = execute(client, session, source)
    assert reply["status"] == "ok" and reply["unsaved"] == ["slow"]
    reply, _ = execute(client, session, "kept += 1")
    assert (reply["path"], reply["unsaved"]) == ("pinned", ["slow"])
    reply, outputs = execute(client, session, "print(kept, type(slow).__name__, Slow.calls)")
    assert text(outputs) == "2 Slow 1\n"  # the value that ran past was not tried again


def test_an_interrupt_stops_a_save_and_the_worker_keeps_what_it_did_not_write(
        server: RunningServer, client: Client, session: str, tmp_path: Path) -> None:
    body = "try:\n                time.sleep(0.05)\n            except KeyboardInterrupt:\n" \
           "                raise\n            except BaseException:\n                pass"
    source = SLOW_SAVE.format(body=body) + "kept = 1\nslow = Slow()"  # past its time limit too
    result = _interrupt_once_saving(server, session, tmp_path, source)
    assert result["reply"]["status"] == "ok" and result["reply"]["unsaved"] == ["slow"]
    reply, outputs = execute(client, session, "print(kept, type(slow).__name__)")
    assert (reply["path"], text(outputs)) == ("pinned", "1 Slow\n")


def test_a_save_that_swallows_its_interrupt_is_killed_and_its_loss_told(
        server: RunningServer, client: Client, session: str, tmp_path: Path) -> None:
    execute(client, session, "kept = 'committed'")
    body = "try:\n                time.sleep(0.05)\n            except BaseException:\n" \
           "                pass"
    result = _interrupt_once_saving(server, session, tmp_path,
                                    SLOW_SAVE.format(body=body) + "slow = Slow()")
    error = result["error"]
    assert (error.kind, error.fields["reason"], error.fields["version"]) == ("stopped", "save", 1)
    assert f"save did not stop within {GRACE} s of its interrupt" in error.message
    assert text(execute(client, session, "print(kept, 'slow' in dir())")[1]) == \
        "committed False\n"


# a value whose own code, run to save and describe it, ends the process if it can
EXITING = """class Exits:
    def __reduce__(self):
        raise SystemExit(3)
    def __repr__(self):
        raise SystemExit(4)
    def __dir__(self):
        raise SystemExit(5)
kept = 1
exits = Exits()
"""


def test_a_value_whose_code_raises_system_exit_is_left_unsaved_and_the_cell_commits(
        client: Client, session: str) -> None:
    reply, _ = execute(client, session, EXITING)
    assert (reply["status"], reply["unsaved"]) == ("ok", ["exits"])
    assert any("exits: SystemExit: 3" in notice["text"] for notice in reply["notices"])
    reply, outputs = execute(client, session, "kept += 1\nprint(kept, type(exits).__name__)")
    assert (reply["path"], text(outputs)) == ("pinned", "2 Exits\n")  # the same worker

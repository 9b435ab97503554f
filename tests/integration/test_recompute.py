"""Values that cannot be saved are rebuilt from their lineage when the worker holding them is lost:
a real server keeps the worker warm, the test kills it with SIGKILL (or restarts the server), and
the next cell must see the value as a plain kernel would, or be told it is lost when re-running
its cells is not safe."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import IMPORT_HOOK, RunningServer, execute, open_session, serving, text

from fabric.client import Client


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store")) as running:  # workers kept warm
        yield running


def _kill_worker(client: Client, session: str) -> None:
    status = next(s for s in client.status().sessions if s.session == session)
    assert status.pinned, status
    deadline = time.monotonic() + 10
    with contextlib.suppress(psutil.NoSuchProcess):  # reaped by the server as soon as it died
        process = psutil.Process(status.worker)
        process.kill()
        while process.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)


def _plain(*cells: str) -> str:
    """What the cells print run one after another in one plain namespace."""
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for cell in cells:
            exec(cell, ns)
    return out.getvalue()


SETUP = "import torch\nmodel = torch.nn.Linear(2, 1)\nx = torch.ones(3, 2)\ny = torch.zeros(3, 1)"
LOSS = "loss = ((model(x) - y) ** 2).mean()"
BACKWARD = "loss.backward()\nprint(model.weight.grad)"


def test_a_graph_tensor_is_rebuilt_on_a_fresh_worker(server, tmp_path: Path) -> None:
    with server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        execute(client, session, "import torch\ntorch.manual_seed(0)\n" + SETUP)
        execute(client, session, LOSS)
        _kill_worker(client, session)
        reply, outputs = execute(client, session, BACKWARD)
    assert reply["status"] == "ok", outputs
    assert reply["path"].endswith("+replay")
    assert text(outputs) == _plain("import torch\ntorch.manual_seed(0)\n" + SETUP, LOSS, BACKWARD)
    assert [n["topic"] for n in reply["notices"]] == ["recomputed"]  # told, not in the cell
    assert reply["unsaved"] == ["loss"]  # held again by the new worker


def test_a_half_consumed_generator_goes_on_where_it_was(server, tmp_path: Path) -> None:
    with server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        execute(client, session, "n = 10")
        execute(client, session, "g = (i for i in range(n))\nprint(next(g))")
        execute(client, session, "print(next(g))")
        _kill_worker(client, session)
        reply, outputs = execute(client, session, "print(next(g))")
        assert text(outputs) == "2\n" and reply["status"] == "ok"
        server.stop()  # and once more after a restart: no worker at all holds it
        server.start()
        client.call("open", session=session, cwd=str(tmp_path))
        reply, outputs = execute(client, session, "print(next(g))")
    assert text(outputs) == "3\n", reply
    assert "re-running cells 2, 3, 4" in reply["notices"][0]["text"]


def test_a_cell_that_writes_a_file_is_not_run_again(server, tmp_path: Path) -> None:
    with server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        execute(client, session, "n = 3")
        execute(client, session, "g = (i for i in range(n))\nopen('out.txt', 'a').write('x')")
        _kill_worker(client, session)
        _, outputs = execute(client, session, "print('g' in dir())")
    assert (tmp_path / "out.txt").read_text() == "x"  # written once, by the cell itself
    lost = outputs[0]
    assert lost["output_type"] == "error" and lost["ename"] == "LLFabricStateLost"
    assert "cannot be recomputed: cell 2 calls write" in lost["evalue"]
    assert text(outputs[1:]) == "False\n"


def test_a_replay_leaves_saved_names_as_committed(server, tmp_path: Path) -> None:
    with server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        execute(client, session, "seen = [1]")
        execute(client, session, "seen.append(2)\ng = (i for i in range(5))\nnext(g)")
        _kill_worker(client, session)
        _, outputs = execute(client, session, "print(seen, next(g))")
        assert text(outputs) == "[1, 2] 1\n"
        # a chain that does not reproduce what it saved: its unsaved value is not trusted
        execute(client, session, "import os\nstamp = [os.urandom(8)]\nh = (x for x in stamp)")
        _, first = execute(client, session, "print(stamp)")
        _kill_worker(client, session)
        _, outputs = execute(client, session, "print(stamp)\nprint('h' in dir())")
    assert outputs[0]["ename"] == "LLFabricStateLost" and "other values" in outputs[0]["evalue"]
    assert outputs[0]["evalue"].startswith("the worker that held h ")  # g was rebuilt
    assert text(outputs[1:]) == text(first) + "False\n"  # the committed stamp, not the replay's


def test_functions_defined_by_the_replayed_cells_match_the_committed_ones(server,
                                                                          tmp_path: Path) -> None:
    with server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        execute(client, session, "n = 3")
        execute(client, session, "def f():\n    return n\ng = (i for i in range(f()))\nnext(g)")
        _kill_worker(client, session)
        reply, outputs = execute(client, session, "print(next(g), f())")
    assert text(outputs) == "1 3\n", reply["notices"]


def test_an_import_hook_the_notebook_defined_stays_with_its_worker(tmp_path: Path) -> None:
    """The hook lives only in the process that ran the cell: even with no worker kept warm, the
    session keeps that one, and a later cell's import finds what the hook serves. Lost with its
    worker (its cell is not safe to run again unasked), the user is told in the cell, and the
    session goes on without it rather than failing every later load on the module it served."""
    (tmp_path / "greeting.txt").write_text("hello from a text module\n")
    with serving(tmp_path / "store", keep_warm=0) as running, \
            running.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        assert execute(client, session, IMPORT_HOOK)[0]["status"] == "ok"
        reply, outputs = execute(client, session, "import txt_greeting\nprint(txt_greeting.text)")
        assert reply["status"] == "ok" and "hello from a text module" in text(outputs), outputs
        _kill_worker(client, session)
        _, lost = execute(client, session, "x = 1")
        reply, outputs = execute(client, session, "print(x + 1)")
    assert lost[0]["ename"] == "LLFabricStateLost"
    assert "sys.meta_path: TextFinder" in lost[0]["evalue"], lost
    assert reply["status"] == "ok" and text(outputs) == "2\n", outputs

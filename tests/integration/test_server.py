"""The first slice end to end: real server, zygotes, forked workers, store on disk."""

from __future__ import annotations

import os
import signal
import time

import msgpack
import pytest
import zmq
from helpers import (
    execute,
    execute_in_thread,
    pid_of_running_cell,
    session_status,
    text,
    wait_until,
)

from fabric.client import Client
from fabric.errors import RemoteError
from fabric.messages import Notice
from fabric.snapshot import Manifest, Store


def test_state_and_aliasing_carry_across_fresh_workers(client: Client, session: str) -> None:
    execute(client, session, "x = [1]\ny = x\nz = {'inner': x}")
    reply, outputs = execute(client, session, "x.append(2)\nprint(y, z['inner'] is x)")
    assert reply["status"] == "ok"
    assert text(outputs) == "[1, 2] True\n"


def test_shell_aliases_are_a_kernels(client: Client, session: str, tmp_path) -> None:
    (tmp_path / "folder").mkdir()
    _, outputs = execute(client, session, f"%cd {tmp_path}\n%ls")
    assert "\x1b[" in text(outputs) and "folder" in text(outputs)  # ls --color, as in a kernel


def test_shell_magics_are_a_kernels(client: Client, session: str) -> None:
    # ipykernel's magics and the storemagic extension, as %lsmagic lists them in a kernel
    reply, outputs = execute(client, session, "%store")  # lists the store, writes nothing
    assert reply["status"] == "ok" and "Stored variables" in text(outputs), outputs
    _, outputs = execute(client, session, "%lsmagic")
    assert {"%clear", "%less", "%man", "%autosave", "%store"} <= set(text(outputs).split())


def test_libraries_see_a_kernel(client: Client, session: str) -> None:
    # tqdm.auto draws a notebook progress bar where ipykernel's shell is loaded, as in a kernel
    _, outputs = execute(client, session, "from tqdm.auto import tqdm\n"
                                          "from tqdm.notebook import tqdm_notebook\n"
                                          "issubclass(tqdm, tqdm_notebook)")
    assert text(outputs) == "True\n"


def test_what_a_kernel_pages_is_no_output(client: Client, session: str) -> None:
    # `obj?` goes to a frontend's pager (a payload of a kernel's reply), not into the notebook
    reply, outputs = execute(client, session, "len?")
    assert reply["status"] == "ok" and outputs == []
    [page] = reply["payload"]
    assert page["source"] == "page" and "Return the number" in page["data"]["text/plain"]


def test_each_cell_runs_in_a_new_process(client: Client, session: str) -> None:
    _, first = execute(client, session, "import os\nos.getpid()")
    _, second = execute(client, session, "os.getpid()")
    assert first[0]["data"]["text/plain"] != second[0]["data"]["text/plain"]


def test_notebook_functions_and_classes_survive_by_value(client: Client, session: str) -> None:
    execute(client, session, "K = 2\ndef scale(v):\n    return v * K\n"
                             "class Box:\n    def __init__(self, v):\n        self.v = v\n"
                             "    def scaled(self):\n        return scale(self.v)")
    execute(client, session, "b = Box(5)")
    execute(client, session, "K = 10")
    reply, outputs = execute(client, session, "b.scaled(), isinstance(b, Box)")
    assert reply["status"] == "ok", outputs
    assert text(outputs) == "(50, True)\n"  # the function reads the session's K of now


def test_closure_loads_only_what_the_cell_reads(client: Client, session: str) -> None:
    execute(client, session, "a = list(range(10))\nb = 'unrelated'\nimport math")
    reply, _ = execute(client, session, "c = len(a)")
    assert reply["closure"]["names"] == ["a"]
    reply, outputs = execute(client, session, "print(b, c, math.pi > 3)")
    assert text(outputs) == "unrelated 10 True\n"


def test_failed_cell_keeps_what_it_changed_before_the_error(client: Client, session: str) -> None:
    execute(client, session, "n = 1")
    reply, outputs = execute(client, session, "n = 2\nm = 'set'\n1 / 0\nn = 3")
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    assert outputs[-1]["output_type"] == "error" and outputs[-1]["traceback"]
    _, outputs = execute(client, session, "print(n, m)")
    assert text(outputs) == "2 set\n"


def test_ipython_semantics(client: Client, session: str) -> None:
    reply, outputs = execute(client, session, "from IPython.display import HTML, display\n"
                                              "display(HTML('<b>hi</b>'))\nv = 41\n!echo shell $v\n"
                                              "v + 1")
    kinds = [o["output_type"] for o in outputs]
    assert kinds == ["display_data", "stream", "execute_result"]
    assert outputs[0]["data"]["text/html"] == "<b>hi</b>"
    assert outputs[1]["text"].strip() == "shell 41"
    assert outputs[2]["data"]["text/plain"] == "42"
    assert outputs[2]["execution_count"] == reply["execution_count"]
    reply, outputs = execute(client, session, "%time w = v * 2")
    assert reply["status"] == "ok" and "Wall time" in text(outputs)
    assert text(execute(client, session, "w")[1]) == "82\n"


def test_random_state_and_cwd_carry_like_a_kernel(client: Client, session: str,
                                                  tmp_path) -> None:
    execute(client, session, "import random, os\nrandom.seed(7)\nos.mkdir('sub')\nos.chdir('sub')")
    _, outputs = execute(client, session, "print(random.random(), os.getcwd())")
    import random

    random.seed(7)
    assert text(outputs) == f"{random.random()} {tmp_path / 'sub'}\n"


def test_a_cwd_gone_is_a_notice_not_an_output(client: Client, session: str, tmp_path) -> None:
    execute(client, session, "import os\nos.mkdir('gone')\nos.chdir('gone')")
    (tmp_path / "gone").rmdir()
    reply, outputs = execute(client, session, "print('ran')")  # a fresh worker restores the cwd
    assert text(outputs) == "ran\n"
    [told] = reply["notices"]
    assert told["topic"] == "ambient" and told["text"].startswith("cannot return to ")


def test_fresh_sessions_get_fresh_random_numbers(client: Client, tmp_path) -> None:
    values = []
    for name in ("rng-a", "rng-b"):
        client.call("open", session=name, cwd=str(tmp_path))
        values.append(text(execute(client, name, "import random\nrandom.random()")[1]))
    assert values[0] != values[1]


def test_draft_prepares_the_worker_before_execute(client: Client, session: str) -> None:
    execute(client, session, "big = list(range(100000))\nsmall = 1")
    draft = client.call("draft", session=session, source="total = sum(big)")
    assert draft.names == ("big",)
    wait_until(lambda: session_status(client, session).tier == "warm",
               "the draft's worker loaded")
    reply, _ = execute(client, session, "total = sum(big)")
    assert reply["path"] == "draft"
    client.call("draft", session=session, source="print(total)")
    reply, outputs = execute(client, session, "print(total, small)")  # edited after the draft
    assert reply["path"] == "draft+load"
    assert text(outputs) == "4999950000 1\n"


def test_syntax_error_is_a_cell_error(client: Client, session: str) -> None:
    execute(client, session, "keep = 'me'")
    reply, outputs = execute(client, session, "def broken(:\n    pass")
    assert reply["status"] == "error" and reply["ename"] == "SyntaxError"
    assert outputs[-1]["ename"] == "SyntaxError"
    assert text(execute(client, session, "keep")[1]) == "'me'\n"


def test_killed_worker_is_an_error_and_the_session_survives(server, client: Client,
                                                            session: str) -> None:
    execute(client, session, "safe = 'committed'")
    thread, result = execute_in_thread(server, session, "safe = 'lost'\nimport time\n"
                                                         "time.sleep(60)")
    os.kill(pid_of_running_cell(server, session), signal.SIGKILL)
    thread.join(30)
    assert result["error"].kind == "worker_died"
    assert "SIGKILL" in result["error"].message
    assert text(execute(client, session, "safe")[1]) == "'committed'\n"


def test_a_worker_that_fails_in_its_own_code_says_why(server, client: Client,
                                                      session: str) -> None:
    # a fault of the worker's own, made by a cell that breaks its save: its stderr is the
    # cells', so only its last words say what ended it
    execute(client, session, "safe = 'committed'")
    with pytest.raises(RemoteError) as failed:
        execute(client, session, "import gc\nfrom fabric.worker.runner import Worker\n"
                                 "worker, = (o for o in gc.get_objects() if type(o) is Worker)\n"
                                 "worker.save = lambda *args: 1 / 0")
    assert failed.value.kind == "worker_died"
    assert "exited with status 1 after ZeroDivisionError: division by zero" in \
        failed.value.message
    assert "in _save_ran" in server.log.read_text()  # where, in the server's log
    assert text(execute(client, session, "safe")[1]) == "'committed'\n"


def test_interrupt_raises_keyboard_interrupt_in_the_cell(server, client: Client,
                                                         session: str, tmp_path) -> None:
    thread, result = execute_in_thread(server, session, "before = 1\nimport time\n"
                                                         "open('started', 'w').close()\n"
                                                         "time.sleep(60)\nafter = 1")
    while not (tmp_path / "started").exists():  # interrupted any sooner, before is not set
        time.sleep(0.05)
    assert client.call("interrupt", session=session).interrupted
    thread.join(30)
    assert result["reply"]["status"] == "error"
    assert result["reply"]["ename"] == "KeyboardInterrupt"
    _, outputs = execute(client, session, "print(before, 'after' in dir())")
    assert text(outputs) == "1 False\n"


def _raw(server, *frames: bytes) -> dict:
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(server.address)
    try:
        sock.send_multipart(list(frames))
        assert sock.poll(10000), "no reply to a bad frame"
        return msgpack.unpackb(sock.recv())
    finally:
        sock.close()


@pytest.mark.parametrize("frames, kind", [
    ([b"\xc1garbage"], "protocol"),
    ([msgpack.packb([1, 2])], "protocol"),
    ([msgpack.packb({"op": "fly", "msg_id": "1"})], "protocol"),
    ([msgpack.packb({"op": "execute", "msg_id": "1"})], "protocol"),
    ([msgpack.packb({"op": "open", "msg_id": "1", "session": "../etc"})], "protocol"),
    ([msgpack.packb({"op": "execute", "msg_id": "1", "session": "nope", "source": "1"})],
     "unknown_session"),
    ([b"a", b"b"], "protocol"),
])
def test_bad_frames_get_errors_and_the_server_keeps_serving(server, client: Client,
                                                            frames, kind) -> None:
    answer = _raw(server, *frames)
    assert answer["type"] == "error"
    assert answer["error"]["kind"] == kind
    assert answer["error"]["message"]
    assert client.ping() and server.alive()


@pytest.mark.parametrize("size", [17 << 20, 65 << 20])  # over max_frame; over 4 x max_frame
def test_oversized_frame_gets_a_frame_too_large_reply(server, client: Client, session: str,
                                                      size: int) -> None:
    with pytest.raises(RemoteError) as err:  # answered at once: no wait for a timeout
        client.call("draft", timeout=60, session=session, source="x" * size)
    assert err.value.kind == "frame_too_large" and err.value.fields["limit"] == 16 << 20
    answer = _raw(server, b"\x00" * size)  # not even msgpack: answered all the same
    assert answer["error"]["kind"] == "frame_too_large"
    assert client.ping() and server.alive()


def test_corrupt_blob_is_refused_and_the_error_is_clear(server, client: Client,
                                                        session: str) -> None:
    execute(client, session, "victim = [1, 2, 3]")
    store = Store(server.store)
    manifest = Manifest.decode(store.get_manifest(store.head(session)))
    blob = manifest.variables()["victim"].blob
    path = server.store / "blobs" / blob[:2] / blob
    original = path.read_bytes()
    path.write_bytes(original[:-1] + b"\x00")
    try:
        with pytest.raises(RemoteError) as err:
            execute(client, session, "victim")
        assert err.value.kind == "load" and "corrupt" in err.value.message
    finally:
        path.write_bytes(original)
    assert text(execute(client, session, "victim")[1]) == "[1, 2, 3]\n"


def test_session_resumes_from_the_store_after_close(client: Client, session: str,
                                                    tmp_path) -> None:
    execute(client, session, "kept = {'a': 1}")
    client.call("close", session=session)
    with pytest.raises(RemoteError) as err:
        execute(client, session, "kept")
    assert err.value.kind == "unknown_session"
    opened = client.call("open", session=session, cwd=str(tmp_path))
    assert opened.version == 1
    assert text(execute(client, session, "kept")[1]) == "{'a': 1}\n"


def test_status_reports_sessions_and_leases(client: Client, session: str) -> None:
    execute(client, session, "q = 1")
    info = client.status()
    assert info.leases.slots >= 1 and info.leases.held == 0
    mine = next(s for s in info.sessions if s.session == session)
    assert mine.version == 1 and mine.variables == 1 and mine.lease_seconds > 0


def test_output_written_to_file_descriptors_reaches_the_cell(client: Client, session: str) -> None:
    reply, outputs = execute(client, session, "import ctypes, os, subprocess\n"
                                              "ctypes.CDLL(None).puts(b'from C')\n"
                                              "os.system('echo from system')\n"
                                              "subprocess.run(['sh', '-c', 'echo oops >&2'])\n"
                                              "print('from python')\n"
                                              "'result'")
    assert reply["status"] == "ok"
    streams = [o for o in outputs if o["output_type"] == "stream"]
    stdout = "".join(o["text"] for o in streams if o["name"] == "stdout")
    assert stdout == "from C\nfrom system\nfrom python\n"
    assert "".join(o["text"] for o in streams if o["name"] == "stderr") == "oops\n"
    assert outputs[-1]["output_type"] == "execute_result"  # everything printed came before it


def test_a_lone_surrogate_prints_replaced(client: Client, session: str) -> None:
    """Text UTF-8 cannot carry (a lone surrogate, as a file name decoded with
    surrogateescape holds) is shown replaced, as a kernel's stream shows it."""
    reply, outputs = execute(client, session, "print('a\\udcffb')\nraise ValueError('\\ud800')")
    assert reply["status"] == "error"
    assert text(outputs) == "a?b\nValueError: ?\n"
    assert text(execute(client, session, "print('next')")[1]) == "next\n"


def test_a_value_that_cannot_be_loaded_can_still_be_deleted(client: Client,
                                                            session: str) -> None:
    """Every cell runs on a fresh worker here: `bad` is unpickled before each cell that needs
    it, and fails; a cell that only deletes it needs no value, so it runs and `bad` is gone."""
    execute(client, session, "def fail():\n    raise RuntimeError('cannot load')\n"
                             "class Bad:\n    def __reduce__(self):\n        return fail, ()\n"
                             "bad = Bad()\nkept = 1")
    with pytest.raises(RemoteError) as failed:
        execute(client, session, "print(bad)")
    assert failed.value.kind == "load" and "RuntimeError: cannot load" in failed.value.message
    execute(client, session, "if kept > 5:\n    del bad")  # not taken: `bad` stays as it was
    with pytest.raises(RemoteError):
        execute(client, session, "print(bad)")
    reply, _ = execute(client, session, "del bad")
    assert reply["status"] == "ok"
    assert text(execute(client, session, "print(kept, 'bad' in dir())")[1]) == "1 False\n"


def test_unpicklable_state_pins_the_session_to_its_worker(client: Client, session: str) -> None:
    execute(client, session, "data = [1, 2, 3]")
    reply, outputs = execute(client, session, "it = iter(data)\ngen = (x for x in data)\n"
                                              "first = next(gen)")
    assert reply["status"] == "ok" and reply["unsaved"] == ["gen"]
    assert outputs == []  # llfabric's notice is not the notebook's output: it goes to status
    [told] = reply["notices"]
    assert told["topic"] == "pinned" and told["text"].startswith("gen cannot be saved")
    info = next(s for s in client.status().sessions if s.session == session)
    assert info.pinned and info.notices[-1] == Notice(**told)
    reply, outputs = execute(client, session, "print(first, next(gen), next(it))")
    assert reply["path"].startswith("pinned")
    assert text(outputs) == "1 2 1\n"  # the live generator and iterator continued
    reply, _ = execute(client, session, "del gen")
    assert reply["unsaved"] == [] and reply["path"].startswith("pinned")
    reply, outputs = execute(client, session, "print(first, list(it))")
    assert reply["path"] == "cold"  # nothing unsaved any more: back to fresh workers
    assert text(outputs) == "1 [2, 3]\n"


def test_views_stay_views_across_cells(client: Client, session: str) -> None:
    execute(client, session, "import numpy as np, torch\nbase = np.arange(12).reshape(3, 4)\n"
                             "t = torch.zeros(4)")
    execute(client, session, "sub = base[:2, :2]\ntail = t[2:]")
    execute(client, session, "sub[0, 0] = 99\ntail += 1")
    _, outputs = execute(client, session, "print(base[0, 0], t.tolist())")
    assert text(outputs) == "99 [0.0, 0.0, 1.0, 1.0]\n"


def test_closed_files_are_saved_as_closed_files(client: Client, session: str) -> None:
    execute(client, session, "with open('notes.txt', 'w') as f:\n    f.write('x')")
    reply, outputs = execute(client, session, "f.closed, f.name")
    assert reply["unsaved"] == [] and text(outputs) == "(True, 'notes.txt')\n"


def test_user_is_told_when_a_pinned_worker_dies(server, client: Client, session: str) -> None:
    # a cell that writes a file is not run again to recompute what it made
    execute(client, session, "kept = 1\ngen = (i for i in range(3))\nopen('f', 'w').close()")
    info = next(s for s in client.status().sessions if s.session == session)
    assert info.pinned
    os.kill(info.worker, signal.SIGKILL)
    wait_until(lambda: session_status(client, session).worker != info.worker,
               "the server learned of its worker's death")
    reply, outputs = execute(client, session, "print(kept, 'gen' in dir())")
    assert reply["path"] == "cold"
    # a loss the user must act on: in the cell, as an error, before what the cell printed
    lost = outputs[0]
    assert lost["output_type"] == "error" and lost["ename"] == "LLFabricStateLost"
    assert lost["evalue"].startswith("the worker that held gen")
    assert "(re-run cell 1 to recompute them)" in lost["evalue"]  # its lineage
    assert lost["evalue"].endswith("cannot be recomputed: cell 1 opens a file for writing, so it "
                                   "is not run again unasked")
    assert text(outputs[1:]) == "1 False\n"
    assert [n["topic"] for n in reply["notices"]] == ["lost"]


def test_a_draft_while_the_pinned_worker_runs_a_cell_loses_nothing(
        server, client: Client, session: str, tmp_path) -> None:
    """A draft that comes while the cell runs (the frontend drafts the next cell as soon as it
    may) finds no worker prepared: the pinned one is busy, not gone."""
    execute(client, session, "gen = (i for i in range(3))\nopen('f', 'w').close()")
    flag = tmp_path / "go"
    thread, result = execute_in_thread(
        server, session,
        f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.05)")
    try:
        pid_of_running_cell(server, session)
        client.draft(session, "print(next(gen))")
    finally:
        flag.touch()
        thread.join(60)
    assert result["reply"]["status"] == "ok" and result["reply"]["path"].startswith("pinned")
    reply, outputs = execute(client, session, "print(next(gen))")
    assert reply["path"].startswith("pinned") and reply["notices"] == []
    assert text(outputs) == "0\n"


def test_evicting_a_zygote_spares_the_families_forked_from_it(server, client: Client,
                                                            session: str) -> None:
    # Each new import makes a new import family, forked from the previous one; more families
    # than the server keeps means ancestors are evicted while their descendants serve cells.
    modules = ["json", "csv", "decimal", "fractions", "statistics", "textwrap", "difflib"]
    for n, module in enumerate(modules):
        reply, outputs = execute(client, session, f"import {module}\nv{n} = {n}")
        assert reply["status"] == "ok", outputs
    _, outputs = execute(client, session, "print(v0 + v6)")
    assert text(outputs) == "6\n"


def test_a_live_autograd_graph_keeps_backward_working(client: Client, session: str) -> None:
    execute(client, session, "import torch\nw = torch.ones(2, requires_grad=True)\n"
                             "loss = (w * 3).sum()")
    reply, outputs = execute(client, session, "loss.backward()\nprint(w.grad.tolist(), loss)")
    assert reply["path"].startswith("pinned")
    assert text(outputs) == "[3.0, 3.0] tensor(6., grad_fn=<SumBackward0>)\n"


def test_torch_from_numpy_keeps_sharing_memory(client: Client, session: str) -> None:
    execute(client, session, "import numpy as np, torch\narr = np.ones(3)\n"
                             "t = torch.from_numpy(arr)")
    execute(client, session, "arr[0] = 7")
    _, outputs = execute(client, session, "print(t.tolist())")
    assert text(outputs) == "[7.0, 1.0, 1.0]\n"

"""Processes a cell starts: DataLoader workers (fork and spawn), multiprocessing.Pool,
ProcessPoolExecutor, joblib's loky, `subprocess.run` of a script and `os.fork` each run, return
their results and print into the cell's output as under a plain kernel, and a cell that shuts
its pools down leaves no process of them behind. Real servers, real workers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import RunningServer, execute, open_session, serving, text

# Importable by the cell and by children that start a fresh interpreter (spawn, loky, a script).
KIDS = '''import json, os, sys


def work(n):
    return os.getpid(), sum(i * i for i in range(n))


def threads():
    import torch
    return torch.get_num_threads()


class Pids:  # a map-style dataset
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return os.getpid(), i


if __name__ == "__main__":
    print(json.dumps(work(int(sys.argv[1]))))
'''
PROLOGUE = "import json, os, sys\nimport kids\n"
EPILOGUE = "print(json.dumps({'worker': os.getpid(), 'out': [list(pair) for pair in out]}))\n"
LOADER = ("from torch.utils.data import DataLoader\n"
          "batches = DataLoader(kids.Pids(), batch_size=2, num_workers=2,"
          " multiprocessing_context={!r})\n"
          "out = [pair for pids, rows in batches for pair in zip(pids.tolist(), rows.tolist())]\n")
SQUARES = sum(i * i for i in range(10))
KINDS = {
    "dataloader-fork": (LOADER.format("fork"), list(range(8))),
    "dataloader-spawn": (LOADER.format("spawn"), list(range(8))),
    "pool": ("import multiprocessing\n"
             "with multiprocessing.Pool(2) as pool:\n"
             "    out = pool.map(kids.work, [10] * 4)\n", [SQUARES] * 4),
    "process-pool": ("from concurrent.futures import ProcessPoolExecutor\n"
                     "with ProcessPoolExecutor(2) as executor:\n"
                     "    out = list(executor.map(kids.work, [10] * 4))\n", [SQUARES] * 4),
    "loky": ("import joblib\nfrom joblib.externals.loky import get_reusable_executor\n"
             "out = joblib.Parallel(n_jobs=2)(joblib.delayed(kids.work)(10) for _ in range(4))\n"
             "get_reusable_executor().shutdown(wait=True)\n", [SQUARES] * 4),
    "subprocess": ("import subprocess\n"
                   "out = [json.loads(subprocess.run([sys.executable, 'kids.py', '10'], "
                   "capture_output=True, check=True).stdout) for _ in range(2)]\n",
                   [SQUARES] * 2),
    "fork": ("out = []\n"
             "for _ in range(2):\n"
             "    read, write = os.pipe()\n"
             "    if (pid := os.fork()) == 0:\n"
             "        os.write(write, json.dumps(kids.work(10)).encode())\n"
             "        os._exit(0)\n"
             "    os.close(write)\n"
             "    with os.fdopen(read) as pipe:\n"
             "        out.append(json.loads(pipe.read()))\n"
             "    os.waitpid(pid, 0)\n", [SQUARES] * 2),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store")) as running:
        yield running


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    (tmp_path / "kids.py").write_text(KIDS)
    return tmp_path


def _trackers_only(worker: int) -> list[str]:
    """The worker's children other than the resource trackers that multiprocessing and loky
    keep for the interpreter's life, as they do in a plain kernel."""
    return [" ".join(child.cmdline()) for child in psutil.Process(worker).children()
            if "resource_tracker" not in " ".join(child.cmdline())]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_child_runs_returns_its_results_and_leaves_nothing(
        kind: str, server: RunningServer, cwd: Path) -> None:
    source, results = KINDS[kind]
    with server.client() as client:
        session = open_session(client, cwd)
        reply, outputs = execute(client, session, PROLOGUE + source + EPILOGUE)
        assert reply["status"] == "ok", text(outputs)
        printed = json.loads(text(outputs).splitlines()[-1])
        pids = {pid for pid, _ in printed["out"]}
        assert sorted(result for _, result in printed["out"]) == results
        assert pids and printed["worker"] not in pids  # each ran in a child
        assert not [pid for pid in pids if psutil.pid_exists(pid)]
        assert _trackers_only(printed["worker"]) == []
        client.call("close", session=session)


def test_a_forked_childs_prints_and_displays_reach_the_cell_and_its_exit_waits_on_nothing(
        server: RunningServer, tmp_path: Path) -> None:
    # A forked child once flushed its streams by waiting for the worker's capture readers,
    # which a fork does not carry: 4 s at each child's exit, 40 s for these ten.
    source = ("import multiprocessing\nfrom IPython.display import display\n"
              "fork = multiprocessing.get_context('fork')\n"
              "for i in range(10):\n"
              "    child = fork.Process(target=print, args=(f'child {i}',))\n"
              "    child.start(); child.join()\n"
              "child = fork.Process(target=display, args=({'shown': 1},))\n"
              "child.start(); child.join()\n")
    with server.client() as client:
        session = open_session(client, tmp_path)
        reply, outputs = execute(client, session, source)
        assert reply["status"] == "ok", text(outputs)
        assert text(outputs) == "".join(f"child {i}\n" for i in range(10)) + "{'shown': 1}\n"
        assert reply["timings"]["run"] < 20
        client.call("close", session=session)


def test_a_cells_children_take_the_threads_of_its_lease(server: RunningServer,
                                                       cwd: Path) -> None:
    # Their CPU counts against the cell's lease, as the worker's own does.
    source = ("import multiprocessing, subprocess, sys\nimport kids\n"
              "with multiprocessing.Pool(1) as pool:\n"
              "    print(pool.apply(kids.threads))\n"
              "print(subprocess.run([sys.executable, '-c', 'import kids; print(kids.threads())'],"
              " capture_output=True, text=True, check=True).stdout, end='')\n")
    with server.client() as client:
        grant = client.status().leases.threads
        session = open_session(client, cwd)
        _, outputs = execute(client, session, source)
        assert text(outputs) == f"{grant}\n{grant}\n"
        client.call("close", session=session)

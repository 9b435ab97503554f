"""Compute parity: corpus cells timed in a plain ipykernel and on the fabric, alone and busy.

Besides the corpus notebooks, a notebook of cells that start processes (DataLoader workers forked
and spawned, multiprocessing.Pool, ProcessPoolExecutor, joblib's loky, subprocess.run of a
script, os.fork) after an untimed setup cell; `--children` times it alone.
Each notebook runs top to bottom (on a fresh copy of its folder) in a plain python3 ipykernel,
then through an embedded server with two execution slots: alone, and with a second session
busy on the other slot (a torch matmul loop, interrupted once the notebook is done). For
reference, the plain kernel runs it once more beside the same loop in a second plain process
(threads sized to the host, as a second pinned kernel's). A cell's time is its user code's:
from the kernel's `started` to its execute_reply, and the worker's `run` timing on the fabric.
Cells that take at least `--min` seconds in the plain kernel are compared; the table gives
per-cell ratios (fabric / plain alone; fabric busy / plain alone and / plain busy), their
medians and maxima. Goals: median ratio at most 1.05, no cell over 1.3.
Usage: python bench/parity.py [--notebook PATH ... | --children] [--min 0.5] [-n 1] [--threads N]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import nbformat
from jupyter_client import KernelManager

from fabric.client import Client
from fabric.config import Config
from fabric.embedded import EmbeddedServer

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "notebooks"
NOTEBOOKS = ["pytorch-deep-learning/01_pytorch_workflow.ipynb",  # small torch training loops
             "nn-zero-to-hero/makemore_part1_bigrams.ipynb"]  # torch counting, Python loops, plots
BUSY = ("import torch\nbusy = torch.randn(512, 512)\n"
        "while True:\n    busy = torch.tanh(busy @ busy)")
CLOSED_PROXY = "http://127.0.0.1:9"  # downloads fail at once: the corpus runs offline
CHILDREN_SETUP = """import os, subprocess, sys, multiprocessing
from concurrent.futures import ProcessPoolExecutor
import joblib, torch
from joblib.externals.loky import get_reusable_executor
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
X = torch.randn(20000, 64); y = (X.sum(1) > 0).long()
ds = TensorDataset(X, y)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def step(xb, yb):
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
def work(n):
    return sum(i * i % 7 for i in range(n))
with open("child_script.py", "w") as f:
    f.write("import numpy\\nprint(sum(i * i % 7 for i in range(10**6)), numpy.ones(3).sum())\\n")
"""
# Each cell's first line names it in the table; each takes a second or more plain, as --min asks,
# so that a child's start and exit, not the timer's jitter, are what a ratio shows.
CHILDREN = [
    "# DataLoader workers, fork\nfor xb, yb in DataLoader(ds, batch_size=64, shuffle=True, "
    "num_workers=4):\n    step(xb, yb)",
    "# DataLoader workers, spawn\nfor xb, yb in DataLoader(ds, batch_size=256, shuffle=True, "
    "num_workers=2,\n                         multiprocessing_context='spawn'):\n    step(xb, yb)",
    "# multiprocessing.Pool\nwith multiprocessing.Pool(4) as pool:\n"
    "    total = sum(pool.map(work, [4_000_000] * 8))",
    "# ProcessPoolExecutor\nwith ProcessPoolExecutor(4) as executor:\n"
    "    total = sum(executor.map(work, [4_000_000] * 8))",
    "# joblib.Parallel (loky)\n"
    "total = sum(joblib.Parallel(n_jobs=4)(joblib.delayed(work)(1_000_000) for _ in range(8)))\n"
    "get_reusable_executor().shutdown(wait=True)",
    "# subprocess.run of a script\nfor _ in range(8):\n"
    "    subprocess.run([sys.executable, 'child_script.py'], check=True, capture_output=True)",
    "# os.fork\npids = []\nfor _ in range(4):\n    if (pid := os.fork()) == 0:\n"
    "        work(8_000_000); os._exit(0)\n    pids.append(pid)\n"
    "for pid in pids:\n    os.waitpid(pid, 0)",
]


def environment() -> dict[str, str]:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    env.update({k: CLOSED_PROXY for k in ("http_proxy", "https_proxy", "HTTP_PROXY",
                                           "HTTPS_PROXY")})
    return env


def copy_of(notebook: Path, work: Path) -> Path:
    shutil.copytree(notebook.parent, work)
    return work / notebook.name


def write_children(folder: Path) -> Path:
    """The notebook of cells that start processes, in `folder` (alone there: it is copied)."""
    folder.mkdir()
    notebook = folder / "children.ipynb"
    cells = [nbformat.v4.new_code_cell(source) for source in [CHILDREN_SETUP, *CHILDREN]]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), str(notebook))
    return notebook


def untimed(notebook: Path) -> int:
    """How many leading cells only set up the ones timed: the children notebook's setup."""
    return 1 if notebook.name == "children.ipynb" else 0


def sources(notebook: Path) -> list[str]:
    nb = nbformat.read(str(notebook), as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _stamp(value: object) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def run_plain(notebook: Path, work: Path) -> list[float]:
    """Each cell's seconds in a plain ipykernel, from its start to its reply."""
    cells = sources(notebook)
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(env=environment(), cwd=str(copy_of(notebook, work).parent))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        times = []
        for source in cells:
            msg_id = client.execute(source, allow_stdin=False)
            while (reply := client.get_shell_msg(timeout=600))["parent_header"].get(
                    "msg_id") != msg_id:
                pass
            started = _stamp(reply["metadata"]["started"])
            times.append((_stamp(reply["header"]["date"]) - started).total_seconds())
        return times
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def run_fabric(address: str, notebook: Path, work: Path) -> list[float]:
    """Each cell's run seconds in a fresh session on the fabric."""
    cells = sources(notebook)
    session = f"parity-{uuid.uuid4().hex[:8]}"
    with Client(address) as client:
        client.call("open", session=session, cwd=str(copy_of(notebook, work).parent))
        times = []
        for source in cells:
            reply = client.call("execute", timeout=0, session=session, source=source)
            times.append(float(reply.timings["run"]) if reply else float("nan"))
        client.call("close", session=session)
    return times


class Busy:
    """A second session spinning on the other slot until stopped."""

    def __init__(self, address: str, cwd: Path) -> None:
        self.address, self.session = address, f"busy-{uuid.uuid4().hex[:8]}"
        with Client(address) as client:
            client.call("open", session=self.session, cwd=str(cwd))
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        with Client(self.address) as client:
            client.call("execute", timeout=0, session=self.session, source=BUSY)

    def __enter__(self) -> Busy:
        self.thread.start()
        with Client(self.address) as client:  # spinning once its cell has started
            while not client.status().leases.held:
                time.sleep(0.05)
        time.sleep(1.0)  # past torch's import
        return self

    def __exit__(self, *exc: object) -> None:
        with Client(self.address) as client:
            client.call("interrupt", session=self.session)
            self.thread.join(60)
            client.call("close", session=self.session)


class PlainBusy:
    """A second plain process spinning beside the plain kernel until stopped."""

    def __enter__(self) -> PlainBusy:
        self.process = subprocess.Popen([sys.executable, "-c", BUSY], env=environment())
        time.sleep(3.0)  # past torch's import
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def best(runs: list[list[float]]) -> list[float]:
    return [min(cell) for cell in zip(*runs, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebook", action="append", type=Path,
                        help=f"a notebook to time (default: {', '.join(NOTEBOOKS)} of the corpus)")
    parser.add_argument("--children", action="store_true",
                        help="only the notebook of cells that start processes")
    parser.add_argument("--min", type=float, default=0.5, help="plain seconds a cell must take")
    parser.add_argument("-n", type=int, default=1, help="runs of each; a cell's best counts")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads per lease (default 0: cores // slots)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="llf-parity-") as tmp:
        root = Path(tmp)
        children = write_children(root / "children")
        notebooks = args.notebook or ([] if args.children else
                                      [CORPUS / name for name in NOTEBOOKS]) + [children]
        config = Config(store=root / "store", runtime_dir=root, bind=f"ipc://{root}/s.sock")
        works = (root / f"w{i}" for i in itertools.count())
        with EmbeddedServer(config, {**environment(), "LLFABRIC_SLOTS": "2",
                                     "LLFABRIC_THREADS": str(args.threads)}):
            for notebook in notebooks:
                plain, alone, busy, plain_busy = [], [], [], []
                for _ in range(args.n):
                    plain.append(run_plain(notebook, next(works)))
                    alone.append(run_fabric(config.address, notebook, next(works)))
                    with Busy(config.address, root):
                        busy.append(run_fabric(config.address, notebook, next(works)))
                    with PlainBusy():
                        plain_busy.append(run_plain(notebook, next(works)))
                cells = sources(notebook)
                for index, times in enumerate(zip(best(plain), best(alone), best(busy),
                                                  best(plain_busy), strict=True)):
                    if index >= untimed(notebook) and times[0] >= args.min:
                        head = cells[index].strip().splitlines()[0][:26] if cells[index].strip() \
                            else ""
                        rows.append((f"{notebook.stem[:22]}#{index}", head, *times))
    print(f"{os.cpu_count()} cores, 2 slots, threads {args.threads or 'cores // slots'}; "
          f"seconds of user code, best of {args.n}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("seconds of user code (plain, alone, busy, plain busy) and ratios to plain (alone,\n"
          "busy) and of busy to plain busy (b/pb)")
    print(f"{'cell':26} {'source':26} {'plain':>7} {'alone':>7} {'busy':>7} {'p.busy':>7}  "
          f"{'alone':>5} {'busy':>5} {'b/pb':>5}")
    ratios: dict[str, list[float]] = {"alone / plain": [], "busy / plain": [],
                                      "busy / plain busy": []}
    for name, head, plain_s, alone_s, busy_s, plain_busy_s in rows:
        row = (alone_s / plain_s, busy_s / plain_s, busy_s / plain_busy_s)
        for column, ratio in zip(ratios.values(), row, strict=True):
            column.append(ratio)
        print(f"{name:26} {head:26} {plain_s:7.2f} {alone_s:7.2f} {busy_s:7.2f} "
              f"{plain_busy_s:7.2f}  {row[0]:5.2f} {row[1]:5.2f} {row[2]:5.2f}")
    for label, column in ratios.items():
        if column:
            print(f"{label}: median ratio {statistics.median(column):.2f}, max "
                  f"{max(column):.2f} over {len(column)} cells (goals: 1.05, 1.3)")


if __name__ == "__main__":
    main()

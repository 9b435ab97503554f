"""Kishu driven in a real IPython kernel on the store bench's state: checkpoint and checkout.

Kishu brings its own Jupyter stack (ipylab, jupyter-ui-poll<=1.0.0, ...), so it lives in a
virtual environment of its own (build/kishu-venv, made on first use with kishu==0.3.4,
torch==2.13.0 and this environment's numpy and pandas versions, so both build the same state).
jupyter_client starts an ipykernel with that environment's python. Kishu attaches as `kishu init`
attaches it: a silent execute (which runs no cell hooks) of `init_kishu(NOTEBOOK)`, here on a
notebook file in the bench's work dir, so its SQLite database (NOTEBOOK.kishudb) and its config
(KISHU_PATH_ROOT) land there, not under ~/.kishu.
ENV_KISHU_TEST_MODE is set: with no browser to ask, Kishu then skips saving and reloading the
notebook through the frontend and numbers its commits with counters; checkpoints are unchanged.

What is timed, in the kernel (time.perf_counter):
  checkpoint  Kishu's pre_run_cell and post_run_cell hooks around one cell, bracketed by hooks of
              ours registered before and after Kishu's: finding what the cell changed (dill-
              pickling and hashing every new or accessed variable), updating its graph, pickling
              the changed variables with dill into SQLite (each commit fsync'd) and recording the
              commit. Not included: the cell itself, and its global lookups slowed by Kishu's
              tracking namespace.
  checkout    `_kishu.checkout(COMMIT)` sent as `kishu checkout` sends it (a silent execute), after
              a cell deleted every state variable, so Kishu restores them all from its database,
              which is evicted from the page cache first. Every variable is then checked against
              a digest taken right after the state's cell.
Kishu stores only what dill pickles, and gives up on storing much at all after one variable that
dill cannot pickle (see measure): the state's cell keeps the optimizer's state_dict, as the dill
row does, and deletes the function that built the state.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
from jupyter_client import BlockingKernelClient, KernelManager
from jupyter_client.kernelspec import KernelSpecManager

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / "build" / "kishu-venv"
KISHU = "kishu==0.3.4"
TORCH = "2.13.0"  # the project's pin: no other torch may be installed
TIMEOUT = 3600.0  # seconds for one cell: the 2 GB state is pickled by dill's Python pickler

# Kernel-side helpers, sent before Kishu attaches. Underscored names are ignored by Kishu. They
# look variables up in get_ipython().user_ns: Kishu swaps in a new namespace when it attaches.
SETUP = """
import hashlib as _hashlib, time as _time
import numpy as _np, pandas as _pd, torch as _torch
_marks, _cells = {}, []

def _mark(slot):
    def hook(*_):
        _marks[slot] = _time.perf_counter()
        if slot == "post_after":
            _cells.append(dict(_marks))
    return hook

def _register(when):
    ip = get_ipython()
    ip.events.register("pre_run_cell", _mark("pre_" + when))
    ip.events.register("post_run_cell", _mark("post_" + when))

def _last_cell():
    m = _cells[-1]
    return {"kishu": m["pre_after"] - m["pre_before"] + m["post_after"] - m["post_before"],
            "cell": m["post_before"] - m["pre_after"]}

def _feed(h, v):
    if isinstance(v, _torch.Tensor):
        h.update(v.detach().contiguous().view(-1).view(_torch.uint8).numpy())
    elif isinstance(v, _np.ndarray):
        h.update(_np.ascontiguousarray(v).view(_np.uint8))
    elif isinstance(v, _pd.DataFrame):
        h.update(repr(list(v.columns)).encode())
        h.update(_pd.util.hash_pandas_object(v).to_numpy())
    elif isinstance(v, (_torch.nn.Module, _torch.optim.Optimizer)):
        _feed(h, v.state_dict())
    elif isinstance(v, dict):
        for k, x in v.items():
            h.update(repr(k).encode())
            _feed(h, x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _feed(h, x)
    else:
        h.update(repr(v).encode())

def _digests(names):
    ns, out = get_ipython().user_ns, {}
    for n in names:
        h = _hashlib.blake2b()
        if n in ns:
            _feed(h, ns[n])
            out[n] = h.hexdigest()
    return out

def _checkout(commit):
    kishu = get_ipython().user_ns["_kishu"]
    start = _time.perf_counter()
    kishu.checkout(commit)
    return _time.perf_counter() - start
"""


class KishuUnavailable(Exception):
    """Kishu cannot be driven here; the message says why."""


@dataclass
class KishuResult:
    checkpoint: float  # Kishu's hooks after the cell that built the state
    checkout: float  # restoring that commit after every variable was deleted
    deltas: dict[str, tuple[float, int]]  # later cells, as llfabric's delta rows: s, bytes stored
    own_checkpoint: float  # what Kishu records itself: its checkpoint plan's run alone
    cell: float  # the state-building cell itself, for scale
    db_bytes: int  # its database after the state's commit
    snapshots: list[list[str]]  # the variables Kishu stored together at the state's commit
    not_stored: list[str]  # state variables it did not store (its checkout reruns cells)


def python() -> Path:
    """The Kishu environment's interpreter, made (with install progress on stderr) if need be."""
    exe = VENV / "bin" / "python"
    pins = [KISHU, f"torch=={TORCH}", f"numpy=={np.__version__}", f"pandas=={pd.__version__}"]
    if exe.exists() and _installed(exe, pins):
        return exe
    print(f"kishu: making {VENV} ({' '.join(pins)})", file=sys.stderr)
    try:
        if not exe.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True,
                           stdout=sys.stderr)
        subprocess.run([str(exe), "-m", "pip", "install", *pins], check=True,
                       stdout=sys.stderr)
    except subprocess.CalledProcessError as exc:
        raise KishuUnavailable(f"could not make {VENV}: `{' '.join(exc.cmd)}` exited with "
                               f"{exc.returncode} (its output is on stderr)") from exc
    except OSError as exc:
        raise KishuUnavailable(f"could not make {VENV}: {exc}") from exc
    if not _installed(exe, pins):
        raise KishuUnavailable(f"{VENV} does not hold {' '.join(pins)} after pip install")
    return exe


def _installed(exe: Path, pins: list[str]) -> bool:
    """Whether `exe`'s environment holds exactly these versions (torch's local tag aside)."""
    names = [pin.split("==")[0] for pin in pins]
    code = ("import importlib.metadata as m, json, sys\n"
            "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))")
    try:
        out = subprocess.run([str(exe), "-c", code, *names], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return False
    found = json.loads(out)
    return all(found[name].split("+")[0] == pin.split("==")[1]
               for name, pin in zip(names, pins, strict=True))


class Kernel:
    """An ipykernel in the Kishu environment, and a client that runs cells in it."""

    def __init__(self, exe: Path, work: Path) -> None:
        spec = work / "kernels" / "kishu-bench"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [str(exe), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Kishu bench", "language": "python"}))
        specs = KernelSpecManager(kernel_dirs=[str(work / "kernels")])
        # Kishu reads the kernel id from the connection file's name (kernel-ID.json).
        self.manager = KernelManager(kernel_name="kishu-bench", kernel_spec_manager=specs,
                                     connection_file=str(work / "kernel-bench.json"),
                                     transport="ipc", ip=str(work / "ipc"))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env |= {"KISHU_PATH_ROOT": str(work), "ENV_KISHU_TEST_MODE": "1"}
        self.manager.start_kernel(env=env, cwd=str(work))
        self.client: BlockingKernelClient = self.manager.client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=120)  # RuntimeError if the kernel died or hangs
        except RuntimeError:
            self.close()
            raise

    def run(self, code: str, label: str, silent: bool = False, **expressions: str) -> dict:
        """Run `code` as a cell (hooks fire) or silently (as Kishu's CLI does: no hooks); return
        the values of `expressions`, evaluated after it. A hook's error fails the run."""
        start = time.perf_counter()
        msg_id = self.client.execute(code, silent=silent, store_history=not silent,
                                     user_expressions=expressions, stop_on_error=True)
        stderr = []
        try:
            while True:  # IPython prints a failing hook's traceback and still replies "ok"
                msg = self.client.get_iopub_msg(timeout=TIMEOUT)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream" and msg["content"]["name"] == "stderr":
                    stderr.append(msg["content"]["text"])
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
            reply = self.client.get_shell_msg(timeout=TIMEOUT)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = self.client.get_shell_msg(timeout=TIMEOUT)
        except queue.Empty as exc:
            raise RuntimeError(f"kernel: {label} ran past {TIMEOUT:.0f} s") from exc
        content = reply["content"]
        if content["status"] != "ok":
            raise RuntimeError(f"kernel: {label} failed: {content.get('ename')}: "
                               f"{content.get('evalue')}")
        text = "".join(stderr)
        if "Error in callback" in text:
            raise RuntimeError(f"kernel: a hook failed after {label}:\n{text}")
        if text:
            print(text, end="", file=sys.stderr)
        out = {}
        for name, value in content["user_expressions"].items():
            if value["status"] != "ok":
                raise RuntimeError(f"kernel: {expressions[name]!r}: {value.get('ename')}: "
                                   f"{value.get('evalue')}\n" + "\n".join(value["traceback"]))
            out[name] = ast.literal_eval(value["data"]["text/plain"])
        print(f"kishu: {label} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
        return out

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def measure(exe: Path, work: Path, make_state: str, size: float, names: list[str],
            evict: Callable[[Path], None]) -> KishuResult:
    """Build the state with `make_state` (its source) in a Kishu-attached kernel; time Kishu's
    checkpoint of it, its delta checkpoints, and its checkout after every variable is deleted."""
    work.mkdir()
    notebook = work / "bench.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), str(notebook))
    db = work / "bench.kishudb"
    variables = ", ".join(names)
    after = {"timing": "_last_cell()", "head": "_kishu._kishu_branch.get_head().commit_id"}
    kernel = Kernel(exe, work)
    try:
        kernel.run(SETUP + "\n_register('before')\n", silent=True, label="setup")
        kernel.run(f"from kishu import init_kishu\ninit_kishu({str(notebook)!r})\n"
                   "_register('after')\n", silent=True, label="init_kishu")
        # Kishu pickles with dill, and one variable that dill cannot pickle makes its profiler
        # exclude the class `list` (it profiles each snapshot as a list): it then stores almost
        # nothing and its checkout reruns every cell. Two such variables are avoided: the torch
        # optimizer (the cell keeps its state_dict, as the dill row does) and the function that
        # builds the state (a notebook function pickles by value with its globals, Kishu's
        # namespace, which holds Kishu's own sqlite3 connection): the same cell deletes it.
        build = kernel.run(f"import numpy as np\nimport pandas as pd\nimport torch\n\n"
                           f"{make_state}\n\n{variables} = make_state({size!r}).values()\n"
                           "optimizer = optimizer.state_dict()\ndel make_state\n",
                           label="the state's cell", digests=f"_digests({names!r})", **after)
        commit, before = build["head"], build["digests"]
        own = kernel.run("", silent=True, label="Kishu's own timer",
                         own=f"_kishu._kishu_commit.get_commit({commit!r}).checkpoint_runtime_s")
        db_bytes = db.stat().st_size
        cells = {key: kernel.run(cell, label=key, **after) for key, cell in (
            ("delta: cell touched nothing", "pass"),
            ("delta: read all, changed nothing", f"_n = len([{variables}])"),
            ("delta: one tensor changed", "ten0[:1000] += 1"))}
        kernel.run(f"del {variables}", label="deleting every variable")
        evict(db)
        back = kernel.run("", silent=True, label="checkout", seconds=f"_checkout({commit!r})",
                          digests=f"_digests({names!r})")
    finally:
        kernel.close()
    wrong = sorted(n for n in names if back["digests"].get(n) != before[n])
    if wrong:
        raise RuntimeError(f"kishu checkout did not restore {', '.join(wrong)} as committed")
    with closing(sqlite3.connect(db)) as con:
        stored = con.execute("select commit_id, versioned_name, sum(length(data)) "
                             "from variable_snapshot group by commit_id, versioned_name").fetchall()
    written = Counter()
    for commit_id, _, nbytes in stored:
        written[commit_id] += nbytes
    snapshots = sorted((_names(name) for commit_id, name, _ in stored if commit_id == commit),
                       key=len, reverse=True)
    return KishuResult(
        checkpoint=build["timing"]["kishu"], checkout=back["seconds"],
        deltas={key: (run["timing"]["kishu"], written[run["head"]]) for key, run in cells.items()},
        own_checkpoint=own["own"], cell=build["timing"]["cell"], db_bytes=db_bytes,
        snapshots=snapshots, not_stored=sorted(set(names) - {n for s in snapshots for n in s}))


def _names(versioned: str) -> list[str]:
    """The variable names in Kishu's name for a variable snapshot: "VERSION,NAME,NAME..."."""
    return versioned.split(",")[1:]

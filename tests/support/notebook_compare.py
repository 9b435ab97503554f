"""Differential comparison of notebook executions: plain ipykernel vs llfabric.

The corpus test runs each notebook twice -- once in an ordinary ipykernel
(``run_plain``) and once through llfabric -- and asserts that the two executed
notebooks carry the same outputs (``compare``).  Outputs are first reduced to a
text-only form (``normalize``) with a small set of masks for what legitimately
differs between two *plain* runs of the same notebook (addresses, timings, ...).
The masks were derived empirically by running the whole corpus plain twice and
diffing; every mask documents why it is needed.  ``plain_run`` and ``run_fabric``
are the two runs every corpus differential compares.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import nbformat
import pytest
from nbclient import NotebookClient

from cli.status import describe
from fabric.errors import FabricError

if TYPE_CHECKING:
    from helpers import RunningServer

# Per-cell timeout.  The corpus was recorded at 120 s/cell; the heaviest cell
# (makemore_part3_bn, 83 s there) takes ~3.5x longer on a slow shared 2-core
# VM, so allow overriding it (NB_CELL_TIMEOUT) without editing the test.
CELL_TIMEOUT_S = int(os.environ.get("NB_CELL_TIMEOUT", "300"))

# Downloads must fail fast rather than hang: point proxies at a closed port
# (port 9 is "discard"; nothing listens on it on a CI box).
CLOSED_PROXY = "http://127.0.0.1:9"


def notebook_env() -> dict[str, str]:
    """Environment shared by the plain kernel and the llfabric server."""
    env = dict(os.environ)
    env.update(
        MPLBACKEND="Agg",  # no GUI; figures render as <Figure ...> + image/png
        http_proxy=CLOSED_PROXY,
        https_proxy=CLOSED_PROXY,
        HTTP_PROXY=CLOSED_PROXY,
        HTTPS_PROXY=CLOSED_PROXY,
        # Workers size their thread pools as a plain kernel does, to all the cores: a float
        # reduction split over fewer threads rounds differently in its last digits.
        LLFABRIC_THREADS=str(os.cpu_count() or 1),
        # `!` lines find the environment's console scripts (`!tqdm`), as in an activated one
        PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    )
    # Local connections (the kernel's own ZMQ/ipc, llfabric's socket) must
    # not be routed through the dead proxy.
    env.pop("no_proxy", None)
    env.pop("NO_PROXY", None)
    return env


def fresh_copy(nb_path: Path, workdir: Path) -> Path:
    """Copy the notebook's folder (notebook + data files) into ``workdir``.

    Notebooks write files (checkpoints, rendered graphs) next to themselves, so
    every execution gets its own pristine copy.  Returns the copied notebook.
    """
    if workdir.exists():
        shutil.rmtree(workdir)
    shutil.copytree(nb_path.parent, workdir)
    return workdir / nb_path.name


def run_plain(nb_path: Path, workdir: Path) -> nbformat.NotebookNode:
    """Execute ``nb_path`` top to bottom in a plain python3 ipykernel.

    The kernel is the ``python3`` kernelspec; jupyter_client rewrites its
    ``python`` argv[0] to ``sys.executable``, so running under the project's
    venv gives a kernel with the venv's interpreter and packages.
    """
    nb_copy = fresh_copy(nb_path, workdir)
    nb = nbformat.read(nb_copy, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        allow_errors=True,  # errors are outputs too: compare them, don't stop
        resources={"metadata": {"path": str(workdir)}},  # kernel cwd = the copy
    )
    client.execute(env=notebook_env(), cwd=str(workdir))
    return nb


# ---------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------

# (pattern, replacement, why).  Applied in order to every normalized text.
# Each mask hides something that differed between two plain runs of the
# corpus (or is environment-specific by construction); none hides values that
# a correct llfabric run must reproduce.
MASKS: list[tuple[re.Pattern[str], str, str]] = [
    (
        re.compile(r"0x[0-9a-fA-F]{6,16}"),
        "0x<addr>",
        "object reprs embed id()/memory addresses, e.g. <function f at 0x7f3a...>",
    ),
    (
        re.compile(r"(?:/private)?/(?:tmp|var/folders)/[^\s'\"()<>:,]+"),
        "<tmpdir>",
        "each run works in its own fresh temporary copy of the notebook folder",
    ),
    (
        re.compile(r"^CPU times: .*$|^Wall time: .*$", re.MULTILINE),
        "<%time>",
        "%time / %%time report measured durations",
    ),
    (
        re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} +"
                   r"(?:\d{2}:\d{2}|\d{4})\b"),
        "<mtime>",
        "`ls -l` prints when each file was written: the runs write theirs minutes apart",
    ),
    (
        re.compile(r"The slowest run took [\d.]+ times longer than the fastest\. This could "
                   r"mean that an intermediate result is being cached\.\n"),
        "",
        "%timeit warns so when its runs happen to vary, a matter of timing",
    ),
    (
        re.compile(r"^[\d.]+ [nµμm]?s ± [\d.]+ [nµμm]?s per loop \(mean ± std\. dev\. of "
                   r"\d+ runs?, [\d,]+ loops? each\)$", re.MULTILINE),
        "<%timeit>",
        "%timeit reports durations, and its loop count is chosen from them",
    ),
    (
        re.compile(r"\[(?:\d+:)?\d\d:\d\d(?:<(?:\d+:)?\d\d:\d\d|<\?)?, +(?:\?|[\d.]+[kMGTP]?)"
                   r"(?:\w*/s|s/\w+)"),
        "[<tqdm time>",
        "tqdm's progress bars end with the time spent, the time left and the rate",
    ),
]

# Cells whose printed *values* differ between two plain runs because they use
# an unseeded RNG or the clock.  Keyed by "source/name", then code-cell index
# (0-based).  "numbers": every number in the cell's outputs is masked and
# whitespace collapsed, so the structure -- shapes, dtypes, labels, which
# outputs exist, errors -- is still compared.  "text": random text (sampled
# names); only the kinds of outputs and their line counts are compared.
Volatility = Literal["numbers", "text"]

VOLATILE_CELLS: dict[str, dict[int, tuple[Volatility, str]]] = {
    "LLMs-from-scratch/appendixA_code-part1": {
        22: ("numbers", "prints weights of a model built before any torch.manual_seed"),
    },
    "PythonDataScienceHandbook/02.04-Computation-on-arrays-aggregates": {
        # cell 0: rng = np.random.default_rng() -- no seed; 1-11 use its data
        i: ("numbers", "data from the unseeded default_rng() of cell 0") for i in range(1, 12)
    },
    "PythonDataScienceHandbook/02.07-Fancy-Indexing": {
        14: ("numbers", "np.random.choice on the unseeded global RNG"),
    },
    "PythonDataScienceHandbook/03.01-Introducing-Pandas-Objects": {
        26: ("numbers", "DataFrame of unseeded np.random.rand"),
    },
    "PythonDataScienceHandbook/03.05-Hierarchical-Indexing": {
        i: ("numbers", "frames built from unseeded np.random.rand (cells 11, 18, 32)")
        for i in (11, 18, 19, 27, 28, 29, 30, 31, 32, 34, 35)
    },
    "micrograd/demo": {
        # Seeded, but Value._prev is a set ordered by id(): gradient sums are
        # accumulated in address order, so losses differ in the last digits.
        6: ("numbers", "float summation order follows object addresses"),
    },
    "nn-zero-to-hero/makemore_part1_bigrams": {
        31: ("numbers", "unseeded torch.randn"),
    },
    "nn-zero-to-hero/makemore_part2_mlp": {
        11: ("numbers", "activations of weights from unseeded torch.randn (cells 7-9)"),
        28: ("numbers", "loss after training on unseeded torch.randint minibatches"),
        29: ("numbers", "loss after training on unseeded torch.randint minibatches"),
        33: ("text", "names sampled (seeded) from a model trained on unseeded minibatches"),
    },
    "nn-zero-to-hero/makemore_part4_backprop": {
        # cell 7 draws bngain/bnbias from the unseeded global torch RNG; the
        # loss, the gradient-check maxdiffs and everything after follow from it
        **{i: ("numbers", "values derived from unseeded bngain/bnbias (cell 7)")
           for i in (9, 10, 11, 12, 14, 15, 16, 19)},
        # cell 21 re-draws bngain/bnbias unseeded before training
        21: ("numbers", "training loss of a model with unseeded bngain/bnbias"),
        24: ("numbers", "train/val loss of that model"),
        26: ("text", "names sampled (seeded) from that model"),
    },
    "nn-zero-to-hero/micrograd_lecture_first_half_roughly": {
        16: ("numbers", "topological order walks Value._prev, a set ordered by id()"),
    },
    "nn-zero-to-hero/micrograd_lecture_second_half_roughly": {
        # cell 14: Neuron weights come from unseeded random.uniform
        i: ("numbers", "outputs/training of an MLP with unseeded random.uniform weights")
        for i in (15, 17, 18)
    },
    "pytorch-deep-learning/00_pytorch_fundamentals": {
        13: ("numbers", "unseeded torch.rand"),
        21: ("numbers", "unseeded torch.rand"),
    },
    "pytorch-deep-learning/00_pytorch_fundamentals_exercise_solutions": {
        1: ("numbers", "unseeded torch.rand"),
        2: ("numbers", "matmul of unseeded torch.rand tensors"),
    },
    "pytorch-deep-learning/01_pytorch_workflow_exercise_solutions": {
        0: ("numbers", "prints datetime.datetime.now()"),
    },
    "pytorch-deep-learning/02_pytorch_classification": {
        # cell 11 builds model_0 (nn.Sequential) before any torch.manual_seed
        **{i: ("numbers", "predictions of model_0, initialized unseeded in cell 11")
           for i in (12, 15, 16, 17)},
        19: ("numbers", "training of model_0 (seeded loop, unseeded initial weights)"),
    },
    "pytorch-deep-learning/02_pytorch_classification_exercise_solutions": {
        # cell 6 builds model_0 (MoonModelV0) before any torch.manual_seed
        7: ("numbers", "state_dict of model_0, initialized unseeded in cell 6"),
        9: ("numbers", "predictions of the unseeded model_0"),
        11: ("numbers", "training of model_0 (seeded loop, unseeded initial weights)"),
    },
    # this project's corpus (corpus/)
    # "text" where numpy pads each number of an array to the width of the widest, random one
    "PythonDataScienceHandbook/02.01-Understanding-Data-Types": {
        16: ("text", "unseeded np.random.random"),
        17: ("text", "unseeded np.random.normal"),
        18: ("text", "unseeded np.random.randint"),
        20: ("text", "np.empty shows whatever the memory held"),
    },
    "PythonDataScienceHandbook/05.08-Random-Forests": {
        14: ("numbers", "report of a RandomForestClassifier fitted without random_state"),
    },
    "d2l-pytorch/ch04_Automatic_Differentiation": {
        8: ("text", "a.grad == d / a holds or not by the rounding of an unseeded torch.randn"),
    },
    "d2l-pytorch/ch06_Numerical_Stability_and_Initialization": {
        1: ("numbers", "products of unseeded torch.rand and torch.randn matrices"),
        2: ("numbers", "weights drawn by an unseeded xavier_uniform_"),
    },
    "d2l-pytorch/ch07_Custom_Layers": {
        i: ("numbers", "layers initialized unseeded, applied to unseeded torch.rand")
        for i in (4, 8, 9)
    },
    "d2l-pytorch/ch07_Deferred_Initialization": {
        3: ("numbers", "weights of nn.Linear layers initialized unseeded"),
    },
    "d2l-pytorch/ch07_Parameter_Management": {
        i: ("numbers", "parameters of layers initialized unseeded, or their outputs")
        for i in (0, 3, 6, 7, 9, 10, 11, 12, 14, 15, 16)
    },
    "ipython-in-depth/Updating_Displays": {
        4: ("text", "display(display_id=True) names the display by a random uuid"),
    },
    "learn-python3/beginner_15_std_lib": {
        0: ("numbers", "datetime.now() and datetime.utcnow()"),
        1: ("numbers", "datetime.now() formatted"),
        3: ("numbers", "datetime.now() plus a day"),
        4: ("numbers", "datetime.utcnow() in three time zones"),
        7: ("numbers", "log records stamped with the time (asctime)"),
        9: ("numbers", "unseeded random.randint and random.random"),
    },
    "tqdm/DEMO": {
        9: ("text", "the shell's `time` reports durations"),
        10: ("text", "the shell's `time` reports durations"),
        14: ("numbers", "a progress bar's postfix of unseeded random() and randint()"),
        15: ("numbers", "a bar format showing a total time estimated from the time spent"),
        17: ("numbers", "a frame of unseeded np.random.randint"),
    },
    "tqdm/tests_notebook": {
        11: ("text", "a bar of fixed ncols: its width is what the rate's text, a timing, leaves"),
    },
    "scipy-2018-sklearn/13.Cross_Validation": {
        16: ("text", "scores of a ShuffleSplit without random_state"),
    },
    "scipy-2018-sklearn/14.Model_Complexity_and_GridSearchCV": {
        # cells 1, 13 and 15 split with KFold(shuffle=True) / ShuffleSplit, no random_state; the
        # verbose GridSearchCV pads its lines with dots to the width of the scores
        i: ("text", "scores and choices of cross-validation on unseeded shuffled splits")
        for i in (1, 3, 5, 6, 7, 8, 11, 12, 13, 14, 15)
    },
}

_SPACES = re.compile(r"\s+")  # line breaks too: reprs wrap by the width of the numbers
_NUMBER = re.compile(r"\s*(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def mask(text: str) -> str:
    """Apply every mask in ``MASKS`` to ``text``."""
    for pattern, repl, _why in MASKS:
        text = pattern.sub(repl, text)
    return text


def _terminal_text(text: str) -> str:
    """Render carriage returns like a terminal/Jupyter does: keep what is
    visible at the end.  Progress bars redraw with ``\\r`` and how many redraws
    get captured depends on timing."""
    lines = []
    for line in text.split("\n"):
        if "\r" in line:
            parts = [p for p in line.split("\r") if p]
            line = parts[-1] if parts else ""
        lines.append(line)
    return "\n".join(lines)


def _as_text(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


def normalize(outputs: list, volatile: Volatility | None = None) -> list[tuple[str, str]]:
    """Reduce one cell's nbformat outputs to comparable ``(kind, text)`` pairs.

    - Streams are merged per stream name (all stdout, then all stderr): how
      prints are chunked and interleaved with rich outputs depends on flush
      timing, not on what the cell computed.
    - execute_result / display_data keep only ``text/plain`` (or the list of
      mime types when there is none, so a missing plot is still noticed).
    - Errors become ``ename: evalue``; traceback frames name files that
      legitimately differ between executors.
    - ``volatile`` (cells listed in ``VOLATILE_CELLS``) additionally masks
      every number ("numbers") or every line ("text").
    """
    def clean(text: str) -> str:
        text = mask(text)
        if volatile == "text":
            return "\n".join("<line>" for _ in text.split("\n"))
        if volatile == "numbers":
            # Padding follows the width of the (random) numbers: drop it.
            text = _SPACES.sub(" ", _NUMBER.sub("<n>", text))
        return text

    streams: dict[str, list[str]] = {}
    rich: list[tuple[str, str]] = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            streams.setdefault(out.get("name", "stdout"), []).append(_as_text(out.get("text", "")))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "text/plain" in data:
                text = _as_text(data["text/plain"])
            else:
                text = "<" + ", ".join(sorted(data)) + ">"
            rich.append((kind, clean(text)))
        elif kind == "error":
            rich.append(("error", clean(f"{out.get('ename', '')}: {out.get('evalue', '')}")))
        else:
            rich.append((str(kind), ""))
    texts = [(name, _terminal_text("".join(chunks))) for name, chunks in sorted(streams.items())]
    return [(name, clean(text)) for name, text in texts if text] + rich


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------

def _code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


def _flatten(norm: list[tuple[str, str]]) -> list[str]:
    lines: list[str] = []
    for kind, text in norm:
        lines.extend(f"{kind}| {line}" for line in text.split("\n"))
    return lines


def _errors(norm: list[tuple[str, str]]) -> list[str]:
    return [text for kind, text in norm if kind == "error"]


def compare(plain_nb: nbformat.NotebookNode, fabric_nb: nbformat.NotebookNode,
            volatile_cells: Mapping[int, tuple[Volatility, str]] | None = None,
            max_lines: int = 6) -> list[str]:
    """Compare two executed notebooks cell by cell (code cells, by index).

    Returns human-readable differences; an empty list means equal.  An error
    in one run but not the other is a difference; the same ``ename: evalue``
    in both is equal.  ``volatile_cells`` are code-cell indices compared with
    numbers masked (see ``VOLATILE_CELLS``).
    """
    plain_cells, fabric_cells = _code_cells(plain_nb), _code_cells(fabric_nb)
    diffs: list[str] = []
    if len(plain_cells) != len(fabric_cells):
        diffs.append(f"code cell count differs: plain {len(plain_cells)} "
                     f"vs llfabric {len(fabric_cells)}")
    for idx, (p_cell, f_cell) in enumerate(zip(plain_cells, fabric_cells, strict=False)):
        volatile = (volatile_cells or {}).get(idx, (None, ""))[0]
        p_norm = normalize(p_cell.outputs, volatile)
        f_norm = normalize(f_cell.outputs, volatile)
        if p_norm == f_norm:
            continue
        head = p_cell.source.strip().split("\n", 1)[0][:60]
        p_err, f_err = _errors(p_norm), _errors(f_norm)
        if f_err and not p_err:
            diffs.append(f"cell {idx} ({head!r}): errors only in llfabric: {f_err}")
            continue
        if p_err and not f_err:
            diffs.append(f"cell {idx} ({head!r}): errors only in plain: {p_err}")
            continue
        delta = [
            line.rstrip("\n")
            for line in difflib.unified_diff(
                _flatten(p_norm), _flatten(f_norm), "plain", "llfabric", n=0, lineterm=""
            )
            if not line.startswith(("---", "+++", "@@"))
        ]
        shown = "\n    ".join(delta[:max_lines])
        more = f"\n    ... ({len(delta) - max_lines} more)" if len(delta) > max_lines else ""
        diffs.append(f"cell {idx} ({head!r}):\n    {shown}{more}")
    return diffs

# ---------------------------------------------------------------------------
# Running a notebook plain and through llfabric (every corpus differential)
# ---------------------------------------------------------------------------

# Plain runs are expected to be clean: the corpus was recorded with
# allow_errors=False.  A plain error means a broken environment (e.g. no
# `dot`), and would let an identically broken llfabric run pass vacuously.
# Only cells that raise on purpose, to show an error, may: code cell -> why.
PLAIN_ERRORS_ALLOWED: dict[str, dict[int, str]] = {
    "PythonDataScienceHandbook/02.05-Computation-on-arrays-broadcasting": {
        12: "shows the ValueError of shapes that do not broadcast",
    },
    "pydata-book/appa": {31: "shows the ValueError of shapes that do not broadcast"},
    "pydata-book/ch02": {
        8: 'shows the TypeError of "5" + 5',
        21: "shows that a tuple does not support item assignment",
        28: "shows that a str does not support item assignment",
    },
    "pydata-book/ch03": {
        6: "shows that a tuple does not support item assignment",
        46: "shows that a list is unhashable",
        98: "shows float() raising on a non-number",
        101: "shows float() raising on a tuple",
        103: "shows attempt_float passing on a TypeError it does not catch",
        118: "shows decoding a truncated UTF-8 byte string",
        121: "shows reading a file in the wrong encoding",
    },
}

# One notebook = plain run + llfabric run.  The heaviest (makemore_part3_bn)
# takes ~95 s per run on the reference 2-core box but ~6 min on a slow VM.
TEST_TIMEOUT_S = 1500
RUN_TIMEOUT_S = 1200  # below TEST_TIMEOUT_S, so we report instead of being killed


def llfabric_cli() -> str:
    # Prefer the entry point next to the running interpreter (the venv's).
    candidate = Path(sys.executable).parent / "llfabric"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("llfabric")
    if found is None:
        pytest.fail("llfabric CLI not found next to the interpreter or on PATH")
    return found


def nb_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "<no log>"


def _text(out: bytes | str | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def _where_it_hangs(server: RunningServer) -> str:
    """What the server says of its sessions, then its log's tail with every thread's and
    task's stack."""
    try:
        with server.client(timeout=10) as client:
            said = "\n".join(describe(client.status()))
    except FabricError as exc:
        said = f"<no status: {exc}>"
    server.dump_stacks()
    return f"server status:\n{said}\nserver log:\n{_tail(server.log, 400)}\n"


def _check_alive(server: RunningServer) -> None:
    if not server.alive():
        pytest.fail(f"llfabric server exited:\n{_tail(server.log)}")


def run_fabric(server: RunningServer, nb_path: Path, workdir: Path,
               session: str | None = None) -> nbformat.NotebookNode:
    """Execute ``nb_path`` through ``llfabric run`` on a fresh copy of its folder (as session
    `session`, if named)."""
    nb_copy = fresh_copy(nb_path, workdir)
    out = workdir.parent / f"{workdir.name}.out.ipynb"
    cmd = [llfabric_cli(), "run", str(nb_copy), "--connect", server.address,
           "--cwd", str(workdir), "--allow-errors", "--output", str(out)]
    if session is not None:
        cmd += ["--session", session]
    try:
        res = subprocess.run(cmd, env=notebook_env(), capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"llfabric run timed out after {RUN_TIMEOUT_S}s\n{_where_it_hangs(server)}"
                    f"its stderr:\n{_text(timeout.stderr)[-4000:]}")
    if not out.exists():
        _check_alive(server)
        pytest.fail(f"llfabric run wrote no output (rc={res.returncode})\n"
                    f"stderr:\n{res.stderr[-4000:]}\nserver log:\n{_tail(server.log)}")
    nb = nbformat.read(out, as_version=4)
    # CLI contract: non-zero exit iff some cell errored.
    errored = any(o.get("output_type") == "error"
                  for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert (res.returncode != 0) == errored, (
        f"llfabric run exit code {res.returncode} but cell errors={errored}\n"
        f"stderr:\n{res.stderr[-4000:]}")
    return nb


def _plain_error_cells(nb: nbformat.NotebookNode) -> dict[int, list[str]]:
    code = [c for c in nb.cells if c.cell_type == "code"]
    return {i: [text for kind, text in normalize(c.outputs) if kind == "error"]
            for i, c in enumerate(code)
            if any(o.get("output_type") == "error" for o in c.outputs)}


_PLAIN_RUNS: dict[Path, nbformat.NotebookNode] = {}


def plain_run(nb_path: Path, workdir: Path) -> nbformat.NotebookNode:
    """The notebook run in a plain ipykernel, checked clean; once per test session, since every
    fabric front end (llfabric run, an attached kernel) is compared with the same run."""
    if nb_path not in _PLAIN_RUNS:
        plain = run_plain(nb_path, workdir)
        unexpected = {i: e for i, e in _plain_error_cells(plain).items()
                      if i not in PLAIN_ERRORS_ALLOWED.get(nb_id(nb_path), {})}
        assert not unexpected, f"plain run itself errored (broken environment?): {unexpected}"
        _PLAIN_RUNS[nb_path] = plain
    return _PLAIN_RUNS[nb_path]

"""Notebooks whose cells find session names that no source text shows: pickle, torch.save and
torch.load, joblib and multiprocessing look notebook classes and functions up in `__main__` by
name, and code looks names up with getattr(sys.modules['__main__'], name).

Each notebook runs through a real server that gives every cell a fresh worker holding only its
closure (keep_warm=0), and must print what a plain kernel prints; the closure audit must find no
lookup outside a closure, and name what made a closure the whole session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from helpers import RunningServer, serving
from notebook_compare import compare, normalize, notebook_env, run_fabric, run_plain

from fabric.audit import audit_notebook

NOTEBOOKS: dict[str, list[str]] = {
    "pickle_torch": [
        "import pickle\nimport torch\nfrom torch import nn\ntorch.manual_seed(0);",
        "class Model(nn.Module):\n"
        "    def __init__(self, n):\n"
        "        super().__init__()\n"
        "        self.lin = nn.Linear(n, 2)\n"
        "    def forward(self, x):\n"
        "        return self.lin(x)",
        "model = Model(3)\nx = torch.ones(1, 3)\nunrelated = list(range(1000))",
        "print(type(pickle.loads(pickle.dumps(model))).__name__)",
        "torch.save(model, 'model.pt')",
        "again = torch.load('model.pt', weights_only=False)\nprint(type(again).__name__)",
        "print(torch.equal(again(x), model(x)))",
    ],
    "deepcopy_dataclass": [
        "import copy\nfrom dataclasses import dataclass, field",
        "@dataclass\nclass Point:\n    x: float\n    tags: list = field(default_factory=list)",
        "p = Point(1.0, ['a'])",
        "q = copy.deepcopy(p)\nq.tags.append('b')\nprint(p, q, q == p)",
        "print(type(q) is Point, isinstance(p, Point))",
    ],
    "joblib_pipeline": [
        "import joblib\nimport numpy as np\n"
        "from sklearn.base import BaseEstimator, TransformerMixin\n"
        "from sklearn.linear_model import LinearRegression\n"
        "from sklearn.pipeline import make_pipeline",
        "class Square(BaseEstimator, TransformerMixin):\n"
        "    def fit(self, X, y=None):\n"
        "        return self\n"
        "    def transform(self, X):\n"
        "        return X ** 2",
        "X = np.arange(10.0).reshape(-1, 1)\ny = 3 * X.ravel() ** 2 + 1\n"
        "pipe = make_pipeline(Square(), LinearRegression()).fit(X, y)",
        "joblib.dump(pipe, 'pipe.joblib')",
        "loaded = joblib.load('pipe.joblib')\nprint(type(loaded.steps[0][1]).__name__)",
        "print(np.round(loaded.predict(X[:3]), 6))",
    ],
    "multiprocessing_fork": [
        "import multiprocessing as mp",
        "def cube(v):\n    return v ** 3",
        "class Ops:\n    @staticmethod\n    def square(v):\n        return v * v\n"
        "jobs = [Ops.square]",
        "with mp.get_context('fork').Pool(2) as pool:\n"
        "    print(pool.map(jobs[0], range(5)), pool.map(cube, range(3)))\n"
        "del pool",
    ],
    "getattr_main": [
        "import sys",
        "alpha = 2\nbeta = 3",
        "name = 'beta'",
        "print(getattr(sys.modules['__main__'], name))",
        "def lookup(n):\n    return getattr(sys.modules['__main__'], n)",
        "print(lookup('alpha'))",
    ],
}

# The cells whose closure is the whole session, and why; every other closure is bounded.
WHOLE = {
    "getattr_main": {3: "the cell uses sys.modules['__main__']",
                     4: "the cell uses sys.modules['__main__']",  # in a function body
                     5: "the code of 'lookup' reads __main__"},
}


def _write(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in NOTEBOOKS[name]]
    nbformat.write(nb, folder / f"{name}.ipynb")
    return folder / f"{name}.ipynb"


@pytest.fixture(scope="module")
def fresh_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store"), notebook_env(), keep_warm=0) as server:
        yield server


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_each_cell_on_its_closure_alone_prints_what_a_plain_kernel_prints(
        name: str, fresh_workers: RunningServer, tmp_path: Path) -> None:
    notebook = _write(name, tmp_path / "nb")
    plain = run_plain(notebook, tmp_path / "plain")
    assert not [o for c in plain.cells for o in c.outputs if o.output_type == "error"]
    fabric = run_fabric(fresh_workers, notebook, tmp_path / "fabric")
    assert compare(plain, fabric) == []


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_audit_finds_no_miss_and_names_what_took_the_whole_session(
        name: str, tmp_path: Path) -> None:
    cells = audit_notebook(_write(name, tmp_path / "nb"), tmp_path / "work", verify=True,
                           env=notebook_env(), log=tmp_path / "audit.log")
    for cell in cells:
        where = f"cell {cell['index']}"
        assert cell["status"] == "ok", where
        assert cell["misses"] == [], where
        assert cell["variable_diffs"] == [], where
        assert normalize(cell["closure_outputs"]) == normalize(cell["outputs"]), where
    assert {c["index"]: c["forced_by"] for c in cells if c["whole"]} == WHOLE.get(name, {})

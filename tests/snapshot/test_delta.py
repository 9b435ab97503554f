"""Delta saves: what a cell cannot have changed is kept, what it may have changed is checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fabric.closure.plan import plan
from fabric.snapshot import Store, loads
from fabric.snapshot.delta import DeltaSaver


class _Notebook:
    """A namespace that runs cells and saves after each, as a worker does."""

    def __init__(self, root: Path) -> None:
        self.store = Store(root, chunk=1 << 16)
        self.saver = DeltaSaver(self.store)
        self.ns: dict = {"__name__": "__main__"}

    def run(self, source: str):
        exec(compile(source, "<cell>", "exec"), self.ns)
        state = [n for n in self.ns if not n.startswith("__")]
        return self.saver.save(self.ns, state, plan(source).reached)

    def files(self) -> dict[Path, int]:
        return {p: p.stat().st_ino for p in (self.store.root / "blobs").rglob("*")
                if p.is_file()}


def _blob(saved, name: str) -> str:
    return next(b for b, names, _ in saved.groups if name in names)


def test_a_group_the_cell_cannot_reach_is_kept_without_io(tmp_path: Path) -> None:
    nb = _Notebook(tmp_path)
    first = nb.run("import numpy as np\nbig = np.arange(100_000.0)\nsmall = 1")
    before = nb.files()
    saved = nb.run("small = small + 1")
    assert "big" in saved.kept and "small" not in saved.kept
    assert [names for _, names, _ in saved.groups] == [["small"]]
    assert nb.files().keys() - before.keys() == {nb.store.disk.path(_blob(saved, "small"))}
    assert all(nb.files()[p] == t for p, t in before.items())
    assert nb.store.disk.has(_blob(first, "big"))


def test_a_read_group_that_did_not_change_costs_no_io(tmp_path: Path) -> None:
    nb = _Notebook(tmp_path)
    first = nb.run("import numpy as np\nbig = np.arange(100_000.0)")
    before = nb.files()
    saved = nb.run("total = float(big.sum())")
    assert _blob(saved, "big") == _blob(first, "big")
    assert {p: t for p, t in nb.files().items() if p in before} == before  # not rewritten


def test_mutation_through_a_notebook_function_is_saved(tmp_path: Path) -> None:
    nb = _Notebook(tmp_path)
    nb.run("data = [1]\ndef grow():\n    data.append(len(data) + 1)\nother = 5")
    saved = nb.run("grow()")  # reads only `grow`; grow reads `data`
    assert "data" not in saved.kept and "other" in saved.kept
    assert loads(nb.store.get_object(_blob(saved, "data")), {})["data"] == [1, 2]


def test_a_new_function_reaching_a_kept_group_regroups_it(tmp_path: Path) -> None:
    nb = _Notebook(tmp_path)
    nb.run("data = [1]\nother = 5")
    saved = nb.run("def push():\n    data.append(9)\npush()")
    assert "data" not in saved.kept
    assert loads(nb.store.get_object(_blob(saved, "data")), {})["data"] == [1, 9]


def test_a_dynamic_cell_keeps_nothing(tmp_path: Path) -> None:
    nb = _Notebook(tmp_path)
    nb.run("x = [1]\ny = [2]")
    saved = nb.run("globals()['x'].append(3)")
    assert saved.kept == []
    assert loads(nb.store.get_object(_blob(saved, "x")), {})["x"] == [1, 3]


def test_loaded_groups_are_fingerprinted_not_kept(tmp_path: Path) -> None:
    # a fresh worker does not know what loaded code reads, so it cannot rule out a mutation
    nb = _Notebook(tmp_path)
    first = nb.run("data = np_data = list(range(5))")
    blob = _blob(first, "data")
    fresh = _Notebook(tmp_path)
    fresh.ns.update(loads(fresh.store.get_object(blob), fresh.ns))
    fresh.saver.loaded(["data", "np_data"], blob, 0)
    saved = fresh.run("n = 1")
    assert saved.kept == [] and _blob(saved, "data") == blob
    assert np.array_equal(loads(fresh.store.get_object(blob), {})["np_data"], list(range(5)))


def test_a_name_regrouped_with_another_is_saved_when_either_changes(tmp_path: Path) -> None:
    # After `b = a`, b's group from the first cell no longer exists: a cell that touches only
    # `a` must not keep `b` as committed (it would load apart from `a`, without the append).
    nb = _Notebook(tmp_path)
    nb.run("a = [0]\nb = 5")
    nb.run("b = a")
    saved = nb.run("a.append(1)")
    assert "b" not in saved.kept
    assert [sorted(names) for _, names, _ in saved.groups] == [["a", "b"]]
    restored = loads(nb.store.get_object(_blob(saved, "b")), {})
    assert restored["a"] is restored["b"] and restored["b"] == [0, 1]


def test_a_name_deleted_from_a_group_leaves_no_stale_group(tmp_path: Path) -> None:
    nb = _Notebook(tmp_path)
    nb.run("a = [0]\nb = a\nc = 1")
    nb.run("del b")
    nb.run("b = 2")
    saved = nb.run("a.append(1)")
    assert saved.kept == ["b", "c"] and [n for _, n, _ in saved.groups] == [["a"]]
    keys = list(nb.saver.objects)  # the groups it knows partition the namespace
    assert sorted(sorted(k) for k in keys) == [["a"], ["b"], ["c"]]

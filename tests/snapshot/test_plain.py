"""Plain data found unchanged by its fingerprint is neither walked nor pickled, and a change made
any way, after a save that took that shortcut, is saved: every group as the namespace holds it,
no object shared by two groups."""

from __future__ import annotations

import collections
import gc
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fabric.snapshot import Store, codec, loads, plain
from fabric.snapshot.delta import DeltaSaver, Saved

SETUP = """
import bisect, heapq, types
import numpy as np, torch
records = [{"id": i, "name": f"row{i}", "score": i * 0.5} for i in range(1000)]
vocab = {f"word{i}": i for i in range(1000)}
nums = [0, 1, 2.0, 0.0, True]
pairs = [(1, 2), (3, (4, [5]))]
tags = {"a", "b"}
config = {"a": 1, "b": [1, 2]}
heap = [1, 3, 5, 7]
ordered = [1, 4, 9]
items = [1, "two", 3.0]
raw = [b"abc", 1]
logs = [{"n": 1}, {"n": 2}]
__history = [logs[0]]  # outside the saved state, as IPython's output history is
"""
PLAIN = ["records", "vocab", "nums", "pairs", "tags", "config", "heap", "ordered", "items"]
_ATOMS = (str, int, float, complex, bool, type(None), bytes, type, types.ModuleType)


class _Notebook:
    """A namespace that runs cells, each saved as a cell that may have read anything is."""

    def __init__(self, root: Path, track: bool = True) -> None:
        self.store = Store(root, chunk=1 << 16)
        self.saver = DeltaSaver(self.store, track=track)
        self.ns: dict[str, Any] = {"__name__": "__main__"}

    def run(self, source: str) -> Saved:
        exec(compile(source, "<cell>", "exec"), self.ns)
        state = [n for n, v in self.ns.items()
                 if not n.startswith("__") and not isinstance(v, types.ModuleType)]
        saved = self.saver.save(self.ns, state, None)
        assert not saved.unsaved, saved.unsaved
        self._check(saved, state)
        return saved

    def _check(self, saved: Saved, state: list[str]) -> None:
        """Every name saved in one group, each group as the namespace holds it (types, values,
        which objects are one: it loads as the namespace's values pickled now load), and no
        object but atoms reached from two groups."""
        assert sorted(n for _, names, _ in saved.groups for n in names) == sorted(state)
        owner: dict[int, int] = {}
        for i, (blob, names, _) in enumerate(saved.groups):
            live = {n: self.ns[n] for n in names}
            back = loads(Store(self.store.root, chunk=1 << 16).get_object(blob), {})
            assert _pickled(back) == _pickled(loads(codec.dumps(live, {}), {})), names
            for ident in _reached(live):
                assert owner.setdefault(ident, i) == i, f"{names} share an object with others"


def _pickled(values: dict[str, Any]) -> tuple[bytes, list[bytes]]:
    encoded = codec.dumps(values, {})
    return encoded.stream, [bytes(b) for b in encoded.buffers]


def _reached(values: dict[str, Any]) -> set[int]:
    """The ids of the objects but atoms that `values` reach."""
    seen: set[int] = set()
    todo = list(values.values())
    while todo:
        obj = todo.pop()
        if isinstance(obj, _ATOMS) or id(obj) in seen:
            continue
        seen.add(id(obj))
        todo.extend(gc.get_referents(obj))
    return seen


@pytest.fixture
def notebook(tmp_path: Path) -> _Notebook:
    """The setup's values, saved, then read by a cell: each plain value found unchanged by its
    fingerprint."""
    nb = _Notebook(tmp_path)
    nb.run(SETUP)
    read = nb.run("total = sum(len(v) for v in (records, vocab, nums, pairs, tags, config))")
    assert set(PLAIN) <= set(read.fingerprinted)
    return nb


def _object(nb: _Notebook, name: str) -> str:
    return nb.saver.objects[frozenset((name,))][0]


def test_plain_data_a_cell_read_is_neither_walked_nor_pickled_nor_written(
        notebook: _Notebook) -> None:
    files = {p: p.stat().st_mtime_ns for p in notebook.store.root.rglob("*") if p.is_file()}
    before = {name: _object(notebook, name) for name in PLAIN}
    saved = notebook.run("total = len(records) + len(vocab)")
    assert sorted(saved.fingerprinted) == sorted(PLAIN)
    assert {names[0]: blob for blob, names, _ in saved.groups if names[0] in PLAIN} == before
    new = {p for p in notebook.store.root.rglob("*") if p.is_file()} - files.keys()
    assert {p.name for p in new} == {_object(notebook, "total")}
    assert all(p.stat().st_mtime_ns >= files[p] for p in files)  # reused ones touched only


CHANGES = {
    "a dict in a list": ['records[5]["score"] = 99.0'],
    "a key deleted": ['del vocab["word7"]'],
    "an equal value of another type": ["nums[4] = 1", "nums[0] = 0.0", "nums[3] = -0.0",
                                       "nums[1] = 1 + 0j"],
    "an equal list for a tuple": ["pairs[0] = [1, 2]"],
    "a list inside tuples": ["pairs[1][1][1].append(6)"],
    "a set grown": ['tags.add("c")'],
    "a dict reordered": ['config["a"] = config.pop("a")'],
    "C extensions (heapq, bisect)": ["heapq.heapreplace(heap, 0)", "bisect.insort(ordered, 5)"],
    "an object bound to a new name, then written through it":
        ["alias = records[5]", 'alias["score"] = -1.0'],
    "an object put in another value, then written": ["items.append(records[6])",
                                                     'records[6]["score"] = -2.0'],
    "an object held outside the state put in another value": ["items.append(logs[0])",
                                                              'logs[0]["n"] = 5'],
    "a value bound to another name, then written": ["same = vocab", 'same["new"] = 1'],
    "two equal values made one, then written": ["ordered = [1, 3, 5, 7]", "heap = ordered",
                                                "total = 0", "heap.append(9)"],
    "numpy in place": ["items.append(np.zeros(4))", "np.add(items[-1], 1, out=items[-1])"],
    "torch in place": ['config["t"] = torch.zeros(4)', 'config["t"].add_(1)'],
    "memoryview": ['items.append(bytearray(b"abc"))', "memoryview(items[-1])[0] = 0x7a"],
    "an attribute set on an instance": ["items.append(types.SimpleNamespace(x=1))",
                                        "items[-1].x = 2", "items[-1].y = [3]"],
    "a cycle": ["items.append(items)"],
    "bytes for equal bytes of another type": ["raw[0] = bytearray(raw[0])",
                                              "raw[0] = memoryview(b'abc')"],
    "equal objects rebuilt": ["records[:] = [dict(r) for r in records]"],
}


@pytest.mark.parametrize("cells", CHANGES.values(), ids=CHANGES)
def test_a_change_made_any_way_is_saved(notebook: _Notebook, cells: list[str]) -> None:
    for cell in cells:
        notebook.run(cell)  # each save checked against the namespace
        notebook.run("total = len(records)")  # and the one after, which may take the shortcut


def test_a_value_bound_to_two_names_is_one_group(notebook: _Notebook) -> None:
    notebook.run("ordered = [1, 3, 5, 7]\ntotal = 0")  # two equal values, each fingerprinted
    notebook.run("total = 1")
    saved = notebook.run("heap = ordered")
    assert ["heap", "ordered"] in [sorted(names) for _, names, _ in saved.groups]


def test_a_value_another_object_reaches_into_is_not_fingerprinted(tmp_path: Path) -> None:
    hidden = [[1]]  # outside the saved state, as an output history is
    ns = {"outer": [hidden[0]]}
    saver = DeltaSaver(Store(tmp_path))
    saver.save(ns, ["outer"], None)
    assert saver.save(ns, ["outer"], None).fingerprinted == [] and saver.plain == {}


@pytest.mark.parametrize("value", [
    [b"bytes"], [bytearray(b"x")], [np.zeros(2)], [types.SimpleNamespace()],
    {"a": collections.OrderedDict()}, [[1]] * 2, [print], [1.0, "s", (2, frozenset({3}))],
], ids=["bytes", "bytearray", "array", "instance", "a dict subclass", "a list twice",
        "a function", "plain"])
def test_only_plain_data_is_fingerprinted(value: object) -> None:
    assert (plain.fingerprint(value) is not None) == (value == [1.0, "s", (2, frozenset({3}))])


def test_a_cycle_is_not_fingerprinted() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    assert plain.fingerprint(cycle) is None and plain.fingerprint([cycle]) is None


def test_tracking_off_pickles_every_group(tmp_path: Path) -> None:
    nb = _Notebook(tmp_path, track=False)
    nb.run(SETUP)
    assert nb.run("total = len(records)").fingerprinted == []
    assert nb.saver.plain == {}


def test_an_object_the_disk_lost_is_written_again(notebook: _Notebook) -> None:
    blob = _object(notebook, "records")
    notebook.store.disk.path(blob).unlink()
    saved = notebook.run("total = 2")
    assert "records" not in saved.fingerprinted
    assert notebook.store.disk.path(blob).exists()


def test_a_value_of_another_type_or_length_is_found_changed_unmarshalled() -> None:
    known = plain.fingerprint([1, 2])
    assert known is not None and plain.unchanged([1, 2], known)
    array = np.zeros(1 << 20)  # which marshal would copy whole
    for value in (array, [1, 2, array], (1, 2), [1, 2, 3]):
        assert not plain.unchanged(value, known)

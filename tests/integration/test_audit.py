"""The closure audit itself: it must see what a cell looks up, and notice a closure that is
too small, or it proves nothing about the corpus."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import nbformat
import pytest
from helpers import IMPORT_HOOK

from fabric import audit
from fabric.audit import recorder
from fabric.closure import Closure

CELLS = [
    "import math\nK = 3\nnotes = ['a']\nalias = notes\n",
    "def scale(v):\n    return v * K + math.pi\n",
    "alias.append('b')\nresult = scale(2)\nprint(result, notes)\n",
    "unused = list(range(10))\n",
]


def _notebook(tmp_path: Path, cells: list[str]) -> Path:
    folder = tmp_path / "nb"
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, folder / "t.ipynb")
    return folder / "t.ipynb"


def test_verified_audit_finds_no_miss_and_equal_runs(tmp_path: Path) -> None:
    cells = audit.audit_notebook(_notebook(tmp_path, CELLS), tmp_path / "work", verify=True)
    assert [c["misses"] for c in cells] == [[], [], [], []]
    assert [c["variable_diffs"] for c in cells] == [[], [], [], []]
    third = cells[2]
    # the cell called scale(), which read K and math: the lookups went through the recorder
    assert set(third["touched"]) == {"alias", "notes", "scale", "K", "math"}
    assert third["closure_outputs"] == third["outputs"]
    assert "9.14" in "".join(o.get("text", "") for o in third["outputs"])  # 2 * K + pi
    # notes shares its list with alias: one group, loaded with it, and counted as touched
    assert third["touched_bytes"] == third["closure_bytes"] > 0
    assert third["closure_variables"] == 4  # alias and notes, scale, K (math is an alias)


def test_script_magics_run_in_the_forked_closure_run(tmp_path: Path) -> None:
    # the first %%bash starts IPython's event loop thread for scripts; a fork does not keep it
    notebook = _notebook(tmp_path, ["%%bash\necho one", "%%bash\necho two"])
    cells = audit.audit_notebook(notebook, tmp_path / "work", verify=True, timeout=60)
    assert [c["closure_outputs"] for c in cells] == [c["outputs"] for c in cells]
    assert "two" in cells[1]["closure_outputs"][0]["text"]


def test_a_closure_that_is_too_small_is_caught(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing(source: str, manifest: object) -> Closure:
        return Closure(frozenset(), (), {}, frozenset(), False, True)

    monkeypatch.setattr(recorder, "closure", nothing)
    monkeypatch.chdir(tmp_path)  # each verified cell runs in a copy of the working directory
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the auditor sets it; undo that after
    auditor = audit.Auditor(verify=True)
    try:
        for index, source in enumerate(CELLS[:2]):
            auditor.cell(index, source)
        third = auditor.cell(2, CELLS[2])
    finally:
        auditor.shell.clear_instance()
    assert set(third.misses) == {"alias", "notes", "scale", "K", "math"}
    assert third.closure_outputs != third.outputs  # a NameError on the closure alone
    assert any("status error on the closure only" in d for d in third.variable_diffs)


def test_lookups_by_name_through_main_are_recorded(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """pickle finds a notebook class in __main__ by name, where no source names it: a closure
    that leaves the class out must show as a miss."""
    real = recorder.closure

    def without_box(source: str, manifest: object) -> Closure:
        found = real(source, manifest)
        return dataclasses.replace(found, names=found.names - {"Box"},
                                   groups=tuple(g for g in found.groups if "Box" not in g.names))

    monkeypatch.setattr(recorder, "closure", without_box)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    auditor = audit.Auditor(verify=True)
    try:
        for index, source in enumerate(["import pickle, sys\nclass Box:\n    pass\n",
                                        "box = Box()\nK = 3\nmain = sys.modules['__main__']\n"]):
            auditor.cell(index, source)
        saved = auditor.cell(2, "blob = pickle.dumps(box)\n")
        looked_up = auditor.cell(3, "print(getattr(main, 'K'))\n")
    finally:
        auditor.shell.clear_instance()
    assert saved.misses == ["Box"]
    assert any("status error on the closure only" in d for d in saved.variable_diffs)
    # getattr on the __main__ module goes through the namespace too; `main` is that module,
    # so the closure is the whole session, and says why
    assert "K" in looked_up.touched and looked_up.misses == []
    assert looked_up.whole and looked_up.forced_by == "'main' is the __main__ module"
    assert "WHOLE cell 3: 'main' is the __main__ module" in audit.report(
        [dataclasses.asdict(looked_up)])


def test_an_import_hook_and_a_magics_own_line_are_no_misses(tmp_path: Path) -> None:
    """A notebook's import hook runs on imports no source shows, reading globals by name: the
    closure is the whole session, and says why. IPython probing the first word of the line a
    magic runs (`%time x = ...`) is not the cell's lookup."""
    nb = _notebook(tmp_path, ["method = [1]\nstrings = ['a', 'b']\n",
                              "%time method = [s for s in strings if s == 'a']\n",
                              IMPORT_HOOK, "import txt_greeting\nprint(txt_greeting.text)\n"])
    (nb.parent / "greeting.txt").write_text("hello from a text module\n")
    cells = audit.audit_notebook(nb, tmp_path / "work", verify=True)
    assert [c["misses"] for c in cells] == [[], [], [], []]
    assert not cells[1]["whole"] and cells[1]["touched"] == ["strings"]
    hooked = cells[3]
    assert hooked["whole"] and "sys.meta_path: TextFinder" in hooked["forced_by"]
    assert {"SUFFIX", "text_path"} <= set(hooked["touched"])
    assert "hello from a text module" in "".join(o.get("text", "") for o in hooked["outputs"])
    assert hooked["closure_outputs"] == hooked["outputs"]


def test_fingerprints_ignore_identity_and_set_order_but_not_values() -> None:
    class Node:
        def __init__(self, v: float) -> None:
            self.v = v
            self.children: set[Node] = set()

    def tree(values: list[float]) -> Node:
        root = Node(0.0)
        root.children = {Node(v) for v in values}
        return root

    fp = audit.Fingerprint
    assert fp().of(tree([1.0, 2.0, 3.0])) == fp().of(tree([3.0, 1.0, 2.0]))
    assert fp().of(tree([1.0, 2.0, 3.0])) != fp().of(tree([1.0, 2.0, 4.0]))
    deep: list = []
    for _ in range(50_000):  # deeper than Python's recursion limit
        deep = [deep]
    assert fp().of(deep)


def test_adjacent_stream_chunks_are_one_output(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # where a stream's chunks split depends on flush timing; a loaded machine moves it
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the auditor sets it; undo that after
    auditor = audit.Auditor()
    try:
        cell = auditor.cell(0, "import sys\nsys.stdout.write('a')\nsys.stdout.flush()\n"
                               "print('b')\n")
    finally:
        auditor.shell.clear_instance()
    assert [(o["name"], o["text"]) for o in cell.outputs] == [("stdout", "ab\n")]

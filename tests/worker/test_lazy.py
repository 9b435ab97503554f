"""Loading on first use (`worker.lazy`) inside one process, with a real shell and store: what a
branch reads loads when the branch is entered, and the server's analysis and the worker's
branch calls agree on every cell of real notebooks."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import nbformat
import pytest

from fabric.closure.static import analyze, branches
from fabric.snapshot import Store, codec
from fabric.worker import lazy
from fabric.worker.shell import make_shell

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO.parent / "shared" / "corpus" / "notebooks").glob("*/*.ipynb")) \
    + sorted((REPO / "corpus").glob("*/*.ipynb"))


@pytest.fixture
def shell():
    made = make_shell()
    made.user_ns.clear()
    made.user_ns["__name__"] = "__main__"
    yield made
    made.user_ns.clear()
    made.ast_transformers.clear()  # a test that failed before its Lazy ended
    if hasattr(builtins, lazy.NEED):
        delattr(builtins, lazy.NEED)


def _pending(store: Store, shell, loaded: list, **groups: dict) -> lazy.Lazy:
    """A Lazy over `shell` with each of `groups` (reads -> values) stored and pending."""
    pending = lazy.Lazy(shell, store.get_objects, lambda *args: loaded.append(args[0]))
    pending.add([(store.put_object(codec.dumps(values, {})), sorted(values), reads.split(","))
                 for reads, values in groups.items()])
    return pending


def test_a_branch_loads_what_it_reads_and_the_cell_ends_with_the_rest_unneeded(
        tmp_path: Path, shell) -> None:
    loaded: list = []
    pending = _pending(Store(tmp_path), shell, loaded,
                       **{"a": {"a": [1]}, "b,f": {"b": 2}, "c": {"c": 3}})
    result = shell.run_cell("x = 1\nif x:\n    print(a)\nelse:\n    print(c)\n")
    assert result.success and shell.user_ns["a"] == [1] and "c" not in shell.user_ns
    assert loaded == [("a",)]
    assert pending.end()[1] == ["b", "c"]
    # after the cell: no branch call any more, no builtin left behind
    assert not hasattr(builtins, lazy.NEED) and shell.ast_transformers == []
    assert shell.run_cell("if x:\n    y = 2\n").success


def test_a_name_the_cell_bound_first_keeps_its_value(tmp_path: Path, shell) -> None:
    loaded: list = []
    _pending(Store(tmp_path), shell, loaded, **{"b": {"a": "stored", "b": "stored"}})
    assert shell.run_cell("a = 'mine'\nif a:\n    print(b)\n").success
    assert (shell.user_ns["a"], shell.user_ns["b"]) == ("mine", "stored")


def test_a_store_that_cannot_give_the_group_fails_the_cell_with_what_was_missing(
        tmp_path: Path, shell) -> None:
    store = Store(tmp_path)
    pending = lazy.Lazy(shell, store.get_objects, lambda *args: None)
    pending.add([("0" * 32, ["gone"], ["gone"])])
    result = shell.run_cell("if True:\n    gone\n")
    assert type(result.error_in_exec).__name__ == "LoadFailed"
    assert "could not load gone" in str(result.error_in_exec)
    pending.end()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_maybe_read_of_a_real_cell_is_named_by_its_branch_call(path: Path) -> None:
    """What the server leaves for later, the worker's branch calls ask for, on cells it has
    never seen: each maybe read appears in the call that begins a branch holding it, and the
    cell still compiles with the calls in."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        analysis = analyze(cell.source)
        if not analysis.parsed or not analysis.maybe:
            continue
        tree = lazy._Needs().visit(ast.parse(analysis.source))
        compile(tree, "<cell>", "exec")
        named: set[str] = set()
        for statement in tree.body:
            for body in branches(statement):
                call = body[0].value
                assert call.func.id == lazy.NEED
                named.update(c.value for c in call.args[0].elts)
        assert analysis.maybe <= named, (path.name, cell.source)

"""Which cell is drafted next, and what a session is called, from the notebook on disk."""

from __future__ import annotations

from pathlib import Path

import nbformat

from fabric.attach.notebook_file import META, find_notebook, next_cell_source, session_name


def _notebook(path: Path) -> list[str]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("a = 1"), nbformat.v4.new_markdown_cell("# text"),
                nbformat.v4.new_code_cell("b = a"), nbformat.v4.new_code_cell("c = b\nd = c")]
    nbformat.write(nb, str(path))
    return [c.id for c in nb.cells]


def test_the_next_code_cell_skips_markdown(tmp_path: Path) -> None:
    ids = _notebook(tmp_path / "n.ipynb")
    assert next_cell_source(tmp_path / "n.ipynb", ids[0]) == "b = a"
    assert next_cell_source(tmp_path / "n.ipynb", ids[2]) == "c = b\nd = c"  # saved as lines
    assert next_cell_source(tmp_path / "n.ipynb", ids[3]) is None  # the last cell
    assert next_cell_source(tmp_path / "n.ipynb", "no-such-id") is None


def test_an_unreadable_notebook_drafts_nothing(tmp_path: Path) -> None:
    (tmp_path / "bad.ipynb").write_text("{not json")
    assert next_cell_source(tmp_path / "bad.ipynb", "x") is None
    assert next_cell_source(tmp_path / "missing.ipynb", "x") is None


def test_the_notebook_is_found_from_the_frontends_session_name(tmp_path: Path,
                                                              monkeypatch) -> None:
    _notebook(tmp_path / "n.ipynb")
    monkeypatch.chdir(tmp_path)
    # JupyterLab names it relative to its root; the kernel runs in the notebook's folder.
    assert find_notebook({"JPY_SESSION_NAME": "projects/deep/n.ipynb"}) == tmp_path / "n.ipynb"
    assert find_notebook({"JPY_SESSION_NAME": str(tmp_path / "n.ipynb")}) == tmp_path / "n.ipynb"
    assert find_notebook({"JPY_SESSION_NAME": "other.ipynb"}) is None
    assert find_notebook({}) is None


def _saved(path: Path, identity: dict | None = None, ran: bool = False) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("a = 1", execution_count=1 if ran else None)]
    if identity is not None:
        nb.metadata[META] = identity
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def test_a_new_notebook_is_a_new_session_across_its_kernels_restarts(tmp_path: Path) -> None:
    path = _saved(tmp_path / "Untitled.ipynb")
    first = session_name(path, "kernel-1", "Untitled.ipynb")
    assert first == session_name(path, "kernel-1", "Untitled.ipynb")  # a restart keeps it
    assert first.startswith("Untitled-")
    # deleted, and a new notebook made at its path: another session
    path.unlink()
    assert session_name(_saved(path), "kernel-2", "Untitled.ipynb") != first
    assert session_name(None, "kernel-abc") == "kernel-abc"
    assert session_name(_saved(tmp_path / "My Notebook (v2).ipynb"), "k", "x").startswith(
        "My_Notebook__v2_-")


def test_a_notebook_keeps_its_session_moved_and_a_copy_gets_a_new_one(tmp_path: Path) -> None:
    mine = {"session": "analysis-1234", "path": "work/a.ipynb"}
    original = _saved(tmp_path / "work" / "a.ipynb", mine)
    assert session_name(original, "kernel-1", "work/a.ipynb") == "analysis-1234"
    copy = _saved(tmp_path / "work" / "a-Copy1.ipynb", mine)
    theirs = session_name(copy, "kernel-2", "work/a-Copy1.ipynb")
    assert theirs != "analysis-1234"
    _saved(copy, {"session": theirs, "path": "work/a-Copy1.ipynb"})  # as the extension keeps it
    original.rename(tmp_path / "b.ipynb")  # moved: nothing at its old path names the session
    assert session_name(tmp_path / "b.ipynb", "kernel-3", "b.ipynb") == "analysis-1234"
    assert session_name(copy, "kernel-4", "work/a-Copy1.ipynb") == theirs
    bad = _saved(tmp_path / "bad.ipynb", {"session": "../../etc", "path": "bad.ipynb"})
    assert session_name(bad, "kernel-5", "bad.ipynb").startswith("bad-")  # never a bad name


def test_a_notebook_run_before_identities_keeps_its_sessions_name(tmp_path: Path) -> None:
    path = _saved(tmp_path / "old.ipynb", ran=True)
    assert session_name(path, "kernel-1", "old.ipynb") == \
        session_name(path, "kernel-2", "old.ipynb")

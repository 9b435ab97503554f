"""Which cell is drafted next, and what a session is called, from the notebook on disk."""

from __future__ import annotations

from pathlib import Path

import nbformat

from fabric.attach.notebook_file import find_notebook, next_cell_source, session_name


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


def test_session_names_are_valid_and_stable() -> None:
    path = Path("/home/u/My Notebook (v2).ipynb")
    name = session_name(path, "kernel-1")
    assert name == session_name(path, "kernel-2")  # the notebook, not the kernel, names it
    assert name.startswith("My_Notebook__v2_-")
    assert session_name(Path("/other/My Notebook (v2).ipynb"), "k") != name
    assert session_name(None, "kernel-abc") == "kernel-abc"
    assert session_name(Path("/x/.hidden.ipynb"), "k").startswith("hidden-")

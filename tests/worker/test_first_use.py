"""What a worker names as imported on first use (`worker.imports`), in this process with real
packages on disk: a library's lazily imported part is named once; the cell's own imports, what
came with them, and a notebook folder's own modules are not."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import lazy_package

from fabric.worker.imports import FirstUse

NAMES = ("firstuse_lib", "firstuse_own", "firstuse_with", "firstuse_mine")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on the path as a zygote has it, holding the packages of NAMES."""
    root = tmp_path / "site"
    lazy_package(root, "firstuse_lib")
    lazy_package(root, "firstuse_own", imports="firstuse_with")
    lazy_package(root, "firstuse_with")
    lazy_package(root, "firstuse_mine")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m.partition(".")[0] in NAMES]:
        del sys.modules[name]


def test_a_part_a_library_imports_on_first_use_is_named_once(site: Path) -> None:
    import firstuse_lib  # the zygote's family

    first = FirstUse()
    assert firstuse_lib.use() == 42
    assert first.since(["firstuse_lib"]) == ["firstuse_lib.part"]  # `import firstuse_lib` again
    assert firstuse_lib.use() == 42
    assert first.since([]) == []


def test_the_cells_own_imports_and_what_came_with_them_are_not_named(site: Path) -> None:
    import firstuse_lib

    first = FirstUse()
    import firstuse_own  # the cell's own, importing firstuse_with in turn

    assert firstuse_own.use() + firstuse_lib.use() == 84
    assert "firstuse_with" in sys.modules
    assert first.since(["firstuse_own"]) == ["firstuse_lib.part"]


def test_a_module_of_the_notebooks_folder_is_not_named(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = FirstUse()
    notebook = tmp_path / "notebook"  # its package shadows the site's of the same name
    lazy_package(notebook, "firstuse_mine")
    monkeypatch.syspath_prepend(str(notebook))
    import firstuse_mine

    assert firstuse_mine.__file__.startswith(str(notebook))
    assert first.since(["firstuse_mine"]) == []  # the cell's own
    assert firstuse_mine.use() == 42  # a later cell uses it: its part comes on first use
    assert first.since([]) == []  # a zygote would import the site's package, not this one
    import firstuse_lib  # a site package that code the cell calls imports

    assert firstuse_lib.use() == 42
    assert first.since([]) == ["firstuse_lib"]

"""A cell's plan: its source analysed once, the answers everyone asks of it."""

from __future__ import annotations

from fabric.closure.plan import plan


def test_the_same_source_is_planned_once() -> None:
    source = "import numpy as np\ny = np.sum(x)\n"
    assert plan(source) is plan(source)
    assert plan(source).source == source


def test_the_modules_that_count_are_the_packages_not_the_standard_library() -> None:
    cell = plan("import json, os.path\nimport pandas.io\nfrom sklearn import svm\n")
    assert cell.modules == {"pandas.io", "sklearn"}
    assert cell.analysis.imports >= {"json", "os.path", "pandas.io", "sklearn"}


def test_a_bounded_cell_reaches_what_it_reads_and_writes() -> None:
    assert plan("y = x + 1\n").reached == {"x", "y"}


def test_a_cell_that_may_reach_anything_has_no_bound() -> None:
    assert plan("print(globals()['x'])\n").reached is None
    assert plan("f(x\n").reached is None  # a draft that does not parse

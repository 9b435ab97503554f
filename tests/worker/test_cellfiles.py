"""Cells are named as JupyterLab's debugger names them: the hash of a plain ipykernel's cell
files, so that a frontend maps a stopped frame back to its cell."""

from __future__ import annotations

import pytest
from ipykernel.compiler import get_tmp_hash_seed, murmur2_x86

from fabric.worker import cellfiles


@pytest.mark.parametrize("code", ["", "a", "ab", "abc", "abcd", "x = 1\ny = x + 1\n",
                                  "print('héllo ✓ 日本')", "import time\n" * 9])
def test_a_cell_is_named_by_the_hash_a_plain_kernel_uses(code: str) -> None:
    assert cellfiles.murmur2(code, get_tmp_hash_seed()) == murmur2_x86(code, get_tmp_hash_seed())
    assert cellfiles.path(code) == f"{cellfiles.prefix()}{murmur2_x86(code, cellfiles.SEED)}.py"


def test_a_dumped_cell_is_its_file() -> None:
    code = "y = 2\n# a cell dumped for its breakpoints\n"
    path = cellfiles.dump(code)
    assert path == cellfiles.path(code)
    with open(path, encoding="utf-8") as f:
        assert f.read() == code
    assert cellfiles.dump(code) == path  # again: the same file

"""Which cells an attached kernel keeps for itself."""

from __future__ import annotations

import pytest

from fabric.attach.relay import is_local


@pytest.mark.parametrize("source", [
    "%%local\nx = 1", "  %%local\n", "%llfabric status", "%llfabric attach ipc:///tmp/s.sock",
    "%load_ext fabric.attach", "%reload_ext fabric.attach.magics", "%unload_ext fabric.attach",
])
def test_cells_managing_the_attachment_run_in_the_kernel(source: str) -> None:
    assert is_local(source)


@pytest.mark.parametrize("source", [
    "x = 1", "%%time\nx = 1", "%load_ext autoreload\n%autoreload 2", "%%localize\n",
    "print('%%local')", "# %llfabric status\nx", "%llfabricate",
])
def test_other_cells_run_on_the_fabric(source: str) -> None:
    assert not is_local(source)

"""Frontends other than JupyterLab that drive a kernel the same way work on the llfabric kernel:
papermill runs a parameterised notebook (its parameters cell injected, the outputs written) and
`jupyter console` takes one command and prints its output, each a real process against a real
server."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat
import pytest
from attached import KERNEL_NAME, install_test_kernelspec, kernel_env
from helpers import RunningServer


def _env(server: RunningServer, tmp_path: Path, session: str) -> dict[str, str]:
    """A frontend's environment: the llfabric test kernel on its Jupyter path, `session`."""
    install_test_kernelspec(tmp_path / "jupyter")
    return kernel_env(server.address, session,
                      JUPYTER_PATH=str(tmp_path / "jupyter" / "share" / "jupyter"),
                      JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))


def _missing(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"{package} is not installed (requirements-dev.txt)")


@_missing("papermill")
def test_papermill_runs_a_parameterised_notebook(server: RunningServer, tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_NAME,
                                 "language": "python"}
    parameters = nbformat.v4.new_code_cell("n = 1")
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, nbformat.v4.new_code_cell("squares = [i * i for i in range(n)]"),
                nbformat.v4.new_code_cell("print('sum', sum(squares))"),
                nbformat.v4.new_code_cell("%llfabric status")]
    nbformat.write(nb, str(tmp_path / "in.ipynb"))
    session = f"pm-{uuid.uuid4().hex[:10]}"
    done = subprocess.run(
        # a loaded machine's kernel start can outlast papermill's own 60 s
        [sys.executable, "-m", "papermill", "in.ipynb", "out.ipynb", "-k", KERNEL_NAME,
         "-p", "n", "4", "--start-timeout", "240"],
        cwd=tmp_path, env=_env(server, tmp_path, session), capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stderr
    out = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    injected = [c for c in out.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert [c.source for c in injected] == ["# Parameters\nn = 4\n"]
    assert _printed(out.cells[-2]) == "sum 14\n"  # 0 + 1 + 4 + 9
    assert f"llfabric session {session}" in _printed(out.cells[-1])  # on the fabric
    assert [c.execution_count for c in out.cells] == [1, 2, 3, 4, 5]


def _printed(cell: nbformat.NotebookNode) -> str:
    """What a cell printed, as Jupyter shows it: a print may come in more than one stream
    chunk, which a frontend joins."""
    return "".join(o["text"] for o in cell.outputs if o["output_type"] == "stream")


@_missing("jupyter_console")
def test_jupyter_console_runs_a_command_and_prints_its_output(server: RunningServer,
                                                              tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_console", "--kernel", KERNEL_NAME, "--simple-prompt",
         "--ZMQTerminalInteractiveShell.confirm_exit=False",
         "--ZMQTerminalInteractiveShell.kernel_timeout=240"],  # not 60 s on a loaded machine
        input="print('answer', 6 * 7)\n", cwd=tmp_path,
        env=_env(server, tmp_path, f"jc-{uuid.uuid4().hex[:10]}"),
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "answer 42" in done.stdout, done.stdout

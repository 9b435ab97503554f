"""Corpus differential through an attached kernel: each corpus notebook, executed by nbclient
in the "Python 3 (llfabric)" kernel, must give the outputs of a plain ipykernel.

Same notebooks and masks as tests/corpus/test_corpus.py; the llfabric side differs: a Jupyter
frontend drives a kernel whose cells run on the fabric, instead of `llfabric run`, and the server
keeps each session's worker warm between cells, as it does by default (test_corpus.py starts every
cell on a fresh worker loaded with its closure).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from attached import KERNEL_NAME, install_test_kernelspec, kernel_env
from helpers import RunningServer, serving
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from notebook_compare import (
    CELL_TIMEOUT_S,
    TEST_TIMEOUT_S,
    VOLATILE_CELLS,
    compare,
    fresh_copy,
    nb_id,
    notebook_env,
    plain_run,
)
from test_corpus import LONG, NOTEBOOK_PARAMS, skip_unless_full


@pytest.fixture(scope="module")
def fabric_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("fabric-store"), notebook_env()) as server:
        yield server


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    return install_test_kernelspec(tmp_path_factory.mktemp("jupyter"))


def run_attached(server: RunningServer, specs: KernelSpecManager, nb_path: Path,
                 workdir: Path) -> nbformat.NotebookNode:
    """Execute a fresh copy of `nb_path` with nbclient in an attached kernel."""
    nb_copy = fresh_copy(nb_path, workdir)
    nb = nbformat.read(nb_copy, as_version=4)
    session = f"attached-{uuid.uuid4().hex[:10]}"
    env = kernel_env(server.address, session, base=notebook_env())
    km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=True,
                            resources={"metadata": {"path": str(workdir)}})
    try:
        client.execute(env=env, cwd=str(workdir))
        with server.client() as fabric:
            sessions = {s.session: s for s in fabric.status().sessions}
    finally:  # nbclient leaves a kernel it did not start running; its exit closes the session
        if km.has_kernel:
            km.shutdown_kernel()
    # A kernel that failed to attach runs cells itself: the session's count of the cells it ran
    # proves they ran on the fabric (its versions do not: a cell that changes nothing makes none).
    ran = sum(1 for c in nb.cells if c.cell_type == "code" and c.source.strip())
    assert getattr(sessions.get(session), "execution_count", None) == ran, _why_not_run(nb, server)
    return nb


def _why_not_run(nb: nbformat.NotebookNode, server: RunningServer) -> str:
    """What the cells' errors and the server's log say, for a notebook some of whose cells did
    not commit (the log's routine gc lines left out)."""
    errors = [f"cell {c.execution_count}: {o.get('ename')}: {o.get('evalue', '')[:300]}"
              for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    log = [line for line in server.log.read_text().splitlines() if "gc freed" not in line]
    return ("cells did not run on the fabric; their errors:\n" + "\n".join(errors) +
            "\nthe server's log ends:\n" + "\n".join(log[-60:]))


@pytest.mark.slow
@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("nb_path", NOTEBOOK_PARAMS)
def test_attached_notebook_matches_plain(nb_path: Path, fabric_server: RunningServer,
                                         specs: KernelSpecManager, tmp_path: Path) -> None:
    skip_unless_full(nb_path, LONG)
    plain = plain_run(nb_path, tmp_path / "plain")
    attached = run_attached(fabric_server, specs, nb_path, tmp_path / "attached")
    diffs = compare(plain, attached, VOLATILE_CELLS.get(nb_id(nb_path), {}))
    assert diffs == [], "attached kernel output differs from plain:\n" + "\n".join(diffs)

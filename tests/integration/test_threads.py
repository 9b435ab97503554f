"""Compute parity: a worker runs its cell on the cores its lease grants (torch, OpenMP and BLAS
thread pools sized to them), so sessions sharing a host's cores do not oversubscribe them.
Real servers and workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import execute, open_session, serving, text

from fabric.worker import threads

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import threadpoolctl, torch\n"
         "print(torch.get_num_threads(), sorted({p['num_threads'] for p in "
         "threadpoolctl.threadpool_info()}), os.environ['OMP_NUM_THREADS'])")


@pytest.mark.parametrize("settings", [{}, {"slots": 1, "threads": 1}])
def test_a_worker_under_a_lease_uses_the_threads_it_grants(settings: dict,
                                                           tmp_path: Path) -> None:
    cores = os.cpu_count() or 1
    grant = threads.granted(cores, settings.get("slots", cores), settings.get("threads", 0))
    # linger=0: the second cell resumes the worker parked after the first (path warm)
    with serving(tmp_path / "store", linger=0, **settings) as server, server.client() as client:
        assert client.status().leases.threads == grant
        session = open_session(client, tmp_path)
        execute(client, session, "import os")  # torch is imported on this worker, in the cell
        reply, outputs = execute(client, session, PROBE)
        assert reply["path"] == "warm" and text(outputs) == f"{grant} [{grant}] {grant}\n"
        client.call("close", session=session)
        client.call("open", session=session, cwd=str(tmp_path))
        reply, outputs = execute(client, session, PROBE)  # torch came with the worker's zygote
        assert reply["path"] == "cold" and text(outputs) == f"{grant} [{grant}] {grant}\n"


def test_a_zygote_readies_what_each_fork_would_otherwise_import_and_scan() -> None:
    # numpy's random module (lazy: the first worker load reseeds it) and the scan of loaded
    # thread pools (each cell's lease sizes them): once in the zygote, not on every cell's path.
    probe = ("import sys, numpy\n"
             "from fabric.snapshot import ambient\nfrom fabric.worker import threads\n"
             "before = 'numpy.random' in sys.modules\n"
             "ambient.warm(); threads.warm()\n"
             "scanned = threads.pools()\n"
             "print(before, 'numpy.random' in sys.modules, threads.pools() is scanned, "
             "threads.pools() is not None)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.split() == ["False", "True", "True", "True"]

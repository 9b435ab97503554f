"""Compute parity: a worker runs its cell on the cores its lease grants (torch, OpenMP and BLAS
thread pools sized to them), so sessions sharing a host's cores do not oversubscribe them.
Real servers and workers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import execute, open_session, serving, text

from fabric.worker import threads

PROBE = ("import threadpoolctl, torch\n"
         "print(torch.get_num_threads(), sorted({p['num_threads'] for p in "
         "threadpoolctl.threadpool_info()}), os.environ['OMP_NUM_THREADS'])")


@pytest.mark.parametrize("settings", [{}, {"slots": 1, "threads": 1}])
def test_a_worker_under_a_lease_uses_the_threads_it_grants(settings: dict,
                                                           tmp_path: Path) -> None:
    cores = os.cpu_count() or 1
    grant = threads.granted(cores, settings.get("slots", cores), settings.get("threads", 0))
    with serving(tmp_path / "store", **settings) as server, server.client() as client:
        assert client.call("status")["leases"]["threads"] == grant
        session = open_session(client, tmp_path)
        execute(client, session, "import os")  # torch is imported on this worker, in the cell
        reply, outputs = execute(client, session, PROBE)
        assert reply["path"] == "warm" and text(outputs) == f"{grant} [{grant}] {grant}\n"
        client.call("close", session=session)
        client.call("open", session=session, cwd=str(tmp_path))
        reply, outputs = execute(client, session, PROBE)  # torch came with the worker's zygote
        assert reply["path"] == "cold" and text(outputs) == f"{grant} [{grant}] {grant}\n"

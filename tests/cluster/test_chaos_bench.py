"""bench/chaos.py end to end: the cluster corpus notebooks on three hosts under faults of every
kind, seeded. No cell may differ from a plain kernel's; the faults table and the closing line
say what was injected and what came of it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from namespaces import unavailable

pytest.importorskip("ray")  # the host actor finds its node's address with it (no cluster)

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("kill", "partition", "pause", "clock", "remote_slow", "remote_full", "drain")

LAST = re.compile(r"chaos: (\d+) faults injected, (\d+) cells, (\d+) differed, "
                  r"(\d+) reported lost, seed (\d+)")
KIND = re.compile(r"  (\w+) +(\d+)")


def chaos(*args: str, timeout: float) -> tuple[dict[str, int], re.Match[str]]:
    """The bench's run: faults injected by kind, and its closing line. Its hosts are in
    namespaces of their own wherever this machine can make them."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, done.stdout[-6000:] + done.stderr[-6000:]
    hosts = "a plain process" if unavailable() else "in namespaces of its own"
    assert f"every host up, {hosts}" in done.stdout
    last = LAST.fullmatch(lines[-1])
    assert last, lines[-1]
    table = lines[lines.index("faults injected by kind:") + 1:]
    injected = {m[1]: int(m[2]) for m in map(KIND.fullmatch, table[:len(KINDS)]) if m}
    return injected, last


@pytest.mark.slow
def test_a_quick_seeded_run_fires_every_fault_and_no_cell_differs() -> None:
    injected, last = chaos("--quick", "--seed", "7", timeout=540)
    faults, cells, differed, _lost, seed = map(int, last.groups())
    assert differed == 0 and seed == 7
    assert sorted(injected) == sorted(KINDS) and all(n == 1 for n in injected.values())
    assert faults == len(KINDS) and cells > 0


@pytest.mark.deep
@pytest.mark.timeout(3600)
def test_the_default_run_injects_200_faults_and_no_cell_differs() -> None:
    injected, last = chaos(timeout=3500)
    faults, cells, differed, _lost, _seed = map(int, last.groups())
    assert differed == 0 and faults >= 200 and sum(injected.values()) == faults
    assert all(injected[kind] > 0 for kind in KINDS) and cells > 0

"""bench/faults.py end to end on a few of its probes: a cell against a real server (what it
lost and leaked, slots included), saves killed with -9 (the store's temp files), a lost index;
each row's outcome and the closing line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBES = ["looping-repr", "kill-9-saves", "lost-index"]


@pytest.mark.timeout(300)
def test_probes_run_against_real_servers_and_the_last_line_counts_them(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    only = [arg for probe in PROBES for arg in ("--only", probe)]
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "faults.py"), *only],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    lines = done.stdout.splitlines()
    rows = {fields[0]: fields[1:4] for fields in map(str.split, lines)
            if fields and fields[0] in PROBES}  # probe, outcome, lost, leaked
    assert rows == {name: ["ok", "0", "0"] for name in PROBES}, done.stdout + done.stderr
    assert lines[-1] == f"faults: {len(PROBES)} probes, 0 failed"
    assert done.returncode == 0

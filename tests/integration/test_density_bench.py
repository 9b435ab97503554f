"""bench/density.py end to end in its quick mode: plain ipykernels added until the budget stops
them, then a real server's sessions, one table row per side and N, and the closing line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAST = re.compile(r"density: (\d+) sessions against (\d+) plain kernels in the same memory "
                  r"\((\d+\.\d)x\); active cells' p95 visible delay (\d+) ms")
ROW = re.compile(r"\s*(\d+) (plain|llfabric)\s+(\d+\.\d+)\s+(\d+\.\d)\s+(\d+)\s+(\S+)\s+(\S+)"
                 r"\s+(\d+)\s+(\S+)\s+(\S+)")


def small_trace(path: Path) -> Path:
    """One session of four trainings minutes apart: think times of a few minutes."""
    rows = [(0, 1, 0, 1), (1, 1, 3, 2), (2, 4, 7, 1), (3, 1, 12, 3)]
    path.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                    + "".join(f"{j},{g},{t},0,resnet50,{d},0\n" for j, g, t, d in rows))
    return path


def test_the_quick_run_compares_both_sides_and_closes_with_the_density_line(
        tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "density.py"), "--quick",
                           "--trace", str(small_trace(tmp_path / "trace.csv"))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    last = LAST.fullmatch(lines[-1])
    assert last, lines[-1]
    sessions, kernels, ratio = int(last[1]), int(last[2]), float(last[3])
    assert 1 <= sessions <= 3 and kernels >= 1 and ratio == round(sessions / kernels, 1)
    rows = {(int(m[1]), m[2]): m for line in lines if (m := ROW.fullmatch(line))}
    # the budget, not the cap, stopped the plain kernels: the quick run starts one past M
    assert "the cap, not the budget" not in done.stdout
    assert (kernels, "plain") in rows and (sessions, "llfabric") in rows
    for (n, side), row in rows.items():
        assert float(row[3]) > 0, row[0]  # the memory its processes held
        assert int(row[5]) >= n, row[0]  # every session ran a cell in its phase
        assert row[8] == "0", row[0]  # and none failed
        assert (row[9], row[10]) == (("-", "-") if side == "plain" else ("0", "0")), row[0]

"""bench/scale.py's short run: it builds its stores, times every operation, says of each
whether it stays within 3x (and why one that grows must) and which grows most."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_scale_bench_times_each_operation_and_names_the_worst(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "bench/scale.py", "--quick", "--dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    for op in ("first pass", "open", "status", "commit", "retention", "gc", "save", "verify",
               "verify since"):
        assert any(re.fullmatch(rf"{op} +(\d+\.\d+ +){{3}}\d+\.\dx", line) for line in lines), op
        assert any(re.fullmatch(rf"{op}: \d+\.\dx, (within 3x|over 3x: .+)", line)
                   for line in lines), op  # each says whether it grows, and why it must
    assert re.fullmatch(r"scale: worst ratio \d+\.\dx \((open|status|commit|retention|gc|save)\) "
                        r"at 8 sessions against 2", lines[-1])
    assert not list(tmp_path.iterdir())  # its stores are gone

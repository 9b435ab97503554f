#!/usr/bin/env bash
# One call on a GPU machine: the GPU test suite and the GPU benchmarks, in under 8 minutes,
# everything written to one file.
#
#   bench/gpu_check.sh [RESULTS_FILE]      (default: gpu_check.txt)
#
# Runs `pytest -m gpu` (at most 240 s) and bench/gpu.py (at most 200 s). Without a GPU it
# writes why it skipped and exits 0; otherwise it exits with the test suite's status.
# PYTHON overrides the interpreter (default: .venv/bin/python, else python3).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-gpu_check.txt}")"
cd "$root" || exit 1
if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python3
    [[ -x .venv/bin/python ]] && PYTHON=.venv/bin/python
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
: > "$out"

say() { echo "$@" | tee -a "$out"; }

say "llfabric GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
say "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 \
        | sed 's/^/gpu: /' | tee -a "$out"
fi
"$PYTHON" - 2>&1 <<'EOF' | tee -a "$out"
import shutil, subprocess
try:
    import torch
    print(f"torch: {torch.__version__} (CUDA {torch.version.cuda})")
except ImportError:
    print("torch: not installed")
from fabric.pool import criu
from fabric.pool.cuda import find_driver
driver = find_driver()
print(f"checkpoint driver: {type(driver).__name__ if driver else 'none'}")
print(f"templates: {criu.unavailable() or 'available'}")
if shutil.which("cuda-checkpoint"):
    print("cuda-checkpoint:", shutil.which("cuda-checkpoint"))
EOF

why="$("$PYTHON" -c 'import sys; sys.path.insert(0, "bench"); from gpu import why_not; print(why_not() or "")' 2>&1)"
if [[ -n "$why" ]]; then
    say "skipped: $why"
    exit 0
fi

say ""
say "== pytest -m gpu =="
timeout -k 10 240 "$PYTHON" -u -m pytest -m gpu -v -rsP -p no:cacheprovider 2>&1 | tee -a "$out"
tests=${PIPESTATUS[0]}
[[ $tests == 124 ]] && say "the GPU suite ran past its 240 s"

say ""
say "== bench/gpu.py =="
timeout -k 10 200 "$PYTHON" -u bench/gpu.py 2>&1 | tee -a "$out"
bench=${PIPESTATUS[0]}
[[ $bench == 124 ]] && say "the benchmark ran past its 200 s"

say ""
say "tests: exit $tests, benchmark: exit $bench; results in $out"
exit "$tests"

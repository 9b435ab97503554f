#!/usr/bin/env bash
# The one command for a GPU machine: what it offers the GPU path, then the GPU suite and the GPU
# benchmarks as far as its runtime allows, within 7.5 minutes, into one results file.
#
#   bench/device_check.sh [--dry-run] [RESULTS_FILE]
#
# RESULTS_FILE: default $OUT/device_check.txt when OUT is set (the folder a device call brings
# back), else ./device_check.txt.
#
# With a bundle (BUNDLE, default build/device-bundle: `make device-bundle`) it installs the
# bundle's wheels into a temporary folder for the machine's own python3 (PYTHON), whose torch
# and other packages it keeps, and uses the bundle's CRIU, pycriu and llfabric-init. Without one
# it uses the environment as it is (PYTHON: .venv/bin/python, else python3), as on vagrant/.
#
# It reports the runtime (gVisor or Firecracker), the NVIDIA driver, whether the CUDA checkpoint
# API answers for a live CUDA process and whether `criu check` passes; then runs `pytest -m gpu`
# and bench/gpu.py. Without a checkpoint API that answers, the suite leaves out the tests that
# park or restore CUDA state; without a working CRIU, cool workers skip; each says why.
#
# --dry-run (here, without a GPU) proves the rest: the bundle installs into a clean CPython 3.12
# folder with --no-index and its requirements resolve (the machine's own packages stood in by
# BUNDLE.machine/), and every step runs, with the bundle's CRIU, pycriu and init, on a venv that
# sees only the packages the machine has (scripts/device-machine.txt) and the bundle's; CUDA
# skips, and tests/pool/test_templates.py proves the bundle's CRIU (a real server, workers
# restored from CRIU images).
#
# Exit status: 0 when every part ran or skipped with its reason, else 1.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dry=0
if [[ "${1:-}" == --dry-run ]]; then
    dry=1
    shift
fi
out="$(realpath -m "${1:-${OUT:-.}/device_check.txt}")"
bundle="$(realpath -m "${BUNDLE:-$root/build/device-bundle}")"
cd "$root" || exit 1
# The tests that park or restore CUDA state, which need the checkpoint API (pytest -k).
NEEDS_CHECKPOINT="park or checkpoint or warm_worker"
# DEADLINE: seconds for the whole check; TEST_TIMEOUT: for one GPU test, so that one that
# hangs still leaves the others' results and every failure's reason; BENCH_ARGS: bench/gpu.py's
# (by default 1, 4 and 10 GiB once each: the H200 checkpointed device memory at 0.26 GB/s, so
# the driver's row of 10 GiB takes about a minute; bench/gpu.py leaves out the driver rows that
# would not fit in what is left), BENCH_TIME: the seconds kept for it.
deadline=$((SECONDS + ${DEADLINE:-450}))
# seconds left for a part, keeping `keep` for what follows it (30 at least)
left() { local n=$((deadline - SECONDS - ${1:-0})); echo $((n > 30 ? n : 30)); }
failed=0
: >"$out"
say() { echo "$@" | tee -a "$out"; }
section() { say "" && say "== $* =="; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export LLFABRIC_KEEP_LOGS="$tmp/logs"  # the test servers' logs, appended to the results
mkdir -p "$LLFABRIC_KEEP_LOGS"

say "llfabric device check, $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), commit" \
    "$(git describe --always --dirty 2>/dev/null || echo unknown)$( ((dry)) && echo ', dry run')"

# --- the runtime ------------------------------------------------------------------------------
kernel="$(uname -r)"
if [[ "$kernel" == 4.4.0 ]] || dmesg 2>/dev/null | grep -qi gvisor; then
    runtime=gVisor
elif [[ "$kernel" == *-fc-* ]] || dmesg 2>/dev/null | grep -qi firecracker; then
    runtime=Firecracker
else
    runtime=unknown
fi
say "runtime: $runtime (kernel $kernel, $(getconf GNU_LIBC_VERSION), $(nproc) CPUs," \
    "$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), uid $(id -u))"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 \
        | sed 's/^/nvidia-smi: /' | tee -a "$out"
else
    say "nvidia-smi: not found"
fi

# --- the bundle -------------------------------------------------------------------------------
criu=""
if [[ -d "$bundle/wheels" ]]; then
    say "bundle: $(head -n1 "$bundle/MANIFEST")"
    pip=(-m pip install --isolated -q --no-index --find-links "$bundle/wheels")
    cross=()  # pip's flags for another Python than the one running pip: CPython 3.12 x86-64
    ((dry)) && read -ra cross <<<"$(sed -n 's/^pip target: //p' "$bundle/MANIFEST")"
    host="${PYTHON:-python3}"
    ((dry)) && host="${PYTHON:-.venv/bin/python}"
    if ! ((dry)) && ! "$host" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        say "install: the bundle is for CPython 3.12, $host is $("$host" -V 2>&1)" \
            "(without a GPU: --dry-run)"
        exit 1
    fi
    # A folder of its own, after the checkout and before the machine's packages, which stay as
    # they are (a --prefix install would uninstall those it replaces).
    if msg="$(timeout 120 "$host" "${pip[@]}" --no-deps --target "$tmp/site" "${cross[@]}" \
        "$bundle"/wheels/*.whl 2>&1)"; then
        say "install: ok, $(ls "$bundle"/wheels | wc -l) wheels into $tmp/site for" \
            "$( ((dry)) && echo 'CPython 3.12' || echo "$host")"
    else
        say "install: FAILED: $msg"
        failed=1
    fi
    if ((dry)); then
        # Resolved from the bundle alone, the machine's own packages stood in by the wheels the
        # bundle left out.
        if msg="$(timeout 120 "$host" "${pip[@]}" --dry-run --target "$tmp/check" "${cross[@]}" \
            --find-links "$bundle.machine" "$bundle"/wheels/llfabric-*.whl 2>&1)"; then
            say "requirements: all met for CPython 3.12 by the bundle and the" \
                "$(ls "$bundle.machine" | wc -l) stand-ins for the machine's own"
        else
            say "requirements: NOT MET: $msg"
            failed=1
        fi
        # $host is no 3.12, so the steps below run on its copies of the same packages: a venv
        # that sees only those the machine has and those the bundle brings.
        "$host" scripts/device_venv.py "$tmp/venv" scripts/device-machine.txt \
            "$bundle"/wheels/*.whl | tee -a "$out"
        PYTHON="$tmp/venv/bin/python"
        export PYTHONPATH="$root:$bundle/criu/python"
    else
        PYTHON="$host"
        export PYTHONPATH="$root:$tmp/site:$bundle/criu/python"
        # what the bundle's packages need that neither the bundle nor the machine has
        ours="$(ls "$bundle"/wheels | cut -d- -f1 | sed 's/[-_.]/[-_.]/g' | paste -sd'|')"
        unmet="$("$PYTHON" -m pip check 2>&1 | grep -iE "^($ours) " | tr '\n' ' ')"
        say "requirements: ${unmet:-all met (pip check)}"
    fi
    criu="$bundle/criu/bin/criu"
    export LLFABRIC_INIT="$bundle/bin/llfabric-init"
else
    if [[ -z "${PYTHON:-}" ]]; then
        PYTHON=python3
        [[ -x .venv/bin/python ]] && PYTHON=.venv/bin/python
    fi
    export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
    if ! msg="$("$PYTHON" -c 'import fabric.pool' 2>&1)"; then
        say "install: no bundle at $bundle, and $PYTHON cannot import the project" \
            "($(tail -n1 <<<"$msg")): make device-bundle, and send it along"
        exit 1
    fi
    say "install: no bundle at $bundle; using $PYTHON as it is"
    criu="$("$PYTHON" -c 'from fabric.pool.criu import criu_binary; print(criu_binary() or "")')"
fi

# --- CRIU -------------------------------------------------------------------------------------
if [[ -z "$criu" ]]; then
    say "criu check: no criu binary; cool workers skip"
elif msg="$(timeout 60 "$criu" check 2>&1)"; then
    say "criu check: passed ($("$criu" --version | awk '/^Version:/ {print $2}'):" \
        "$(tail -n1 <<<"$msg"))"
    export LLFABRIC_CRIU="$criu"
else
    say "criu check: FAILED on kernel $kernel, so cool workers skip:" \
        "$(tail -n3 <<<"$msg" | tr '\n' ' ')"
fi

# --- what Python sees: torch, NVML, the checkpoint API, pycriu ----------------------------------
timeout 200 "$PYTHON" bench/gpu.py --about 2>&1 | tee "$tmp/about" | tee -a "$out"
[[ ${PIPESTATUS[0]} == 0 ]] || failed=1
# only the modules that hold GPU tests: the others import what the machine need not have
mapfile -t gpu_tests < <(grep -rlE --include='test_*.py' 'mark\.gpu\b' tests | sort)
picks=(-m gpu)
if ! grep -qE '^checkpoint API: (not tried|.*, answers)' "$tmp/about"; then
    picks+=(-k "not ($NEEDS_CHECKPOINT)")
    why="$(grep -m1 '^checkpoint API:' "$tmp/about" || echo 'no answer within 200 s')"
    say "suite: leaves out the tests that need the checkpoint API" \
        "(-k 'not ($NEEDS_CHECKPOINT)'): ${why#checkpoint API: }"
fi

# --- without a GPU, what stands in for it: the bundle's CRIU through a real server ----------
if ((dry)); then
    section "pytest tests/pool/test_templates.py (dry run: the bundle's CRIU without CUDA)"
    timeout -k 10 120 "$PYTHON" -u -m pytest tests/pool/test_templates.py -v -rsP \
        -p no:cacheprovider 2>&1 | tee "$tmp/cpu" >>"$out"
    cpu=${PIPESTATUS[0]}
    say "without CUDA (exit $cpu): $(tail -n1 "$tmp/cpu")"
    [[ $cpu == 0 ]] || failed=1
fi

# --- the GPU suite, then the benchmarks, in what is left ---------------------------------------
limit="$(left "${BENCH_TIME:-180}")"
section "pytest ${picks[*]} ${gpu_tests[*]} (at most $limit s)"
timeout -k 10 "$limit" "$PYTHON" -u -m pytest "${picks[@]}" "${gpu_tests[@]}" -v -rfEsP \
    --timeout "${TEST_TIMEOUT:-120}" -p no:cacheprovider 2>&1 | tee "$tmp/suite" >>"$out"
suite=${PIPESTATUS[0]}
[[ $suite == 124 ]] && say "the GPU suite ran out of time"
[[ $suite == 0 ]] || failed=1

limit="$(left 10)"
section "bench/gpu.py (at most $limit s)"
read -ra bench_args <<<"${BENCH_ARGS:---sizes 1,4,10 -n 1}"
timeout -k 10 "$limit" "$PYTHON" -u bench/gpu.py "${bench_args[@]}" --budget $((limit - 15)) \
    2>&1 | tee "$tmp/bench" >>"$out"
bench=${PIPESTATUS[0]}
[[ $bench == 124 ]] && say "the benchmark ran out of time"
[[ $bench == 0 ]] || failed=1

for log in "$LLFABRIC_KEEP_LOGS"/*.log; do
    [[ -e "$log" ]] || continue
    section "the last 150 lines of a test server's log, $(basename "$log")"
    tail -n 150 "$log" >>"$out"
done

# --- the summary, last, where a device call's output tail shows it ---------------------------
section summary
report='runtime|nvidia-smi|bundle|install|requirements|criu check|python|torch|NVML|checkpoint API'
grep -E "^($report|pycriu|templates|suite|without CUDA \(exit [0-9]+\)):" "$out" | cut -c1-300
grep -E '^(SKIPPED|FAILED|ERROR) ' "$tmp/suite" | cut -c1-200
say "suite (exit $suite): $(tail -n1 "$tmp/suite")"
say "bench/gpu.py (exit $bench):"
tail -n 30 "$tmp/bench"
say "results in $out"
exit "$failed"

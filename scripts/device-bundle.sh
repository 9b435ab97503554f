#!/usr/bin/env bash
# Build, here, everything the GPU test machine lacks into one folder that travels with a call
# there (see docs/user/gpus.md). That machine has a Python 3.12 with torch and a few of our
# dependencies, no network, and takes at most 64 MiB of files with a command.
#
#   scripts/device-bundle.sh [DIR]     (default: build/device-bundle)
#
# DIR/wheels/       the project's wheel and the CPython 3.12 manylinux x86-64 wheels of its
#                   dependencies, less those the machine has (scripts/device-machine.txt)
# DIR/criu/         CRIU (bin/criu runs libexec/criu with the shared libraries in lib/) and
#                   pycriu (python/), from the build scripts/provision-criu.sh made
# DIR/bin/          llfabric-init (make -C native)
# DIR/MANIFEST      what it holds and what it expects of the machine
# DIR.machine/      the wheels the bundle leaves out, which the dry run
#                   (bench/device_check.sh --dry-run) resolves with in place of the machine's own
#
# Exits 75 when the package index cannot be reached (the build needs it), 1 on other errors.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTDIR="$(realpath -m "${1:-$ROOT/build/device-bundle}")"
STANDINS="$OUTDIR.machine"
PY="${PY:-$ROOT/.venv/bin/python}"
CRIU_PREFIX="$ROOT/.criu"
INIT="$ROOT/build/native/llfabric-init"
LIMIT=$((64 << 20))
# What the machine's python3 has installed (normalised names): the bundle leaves these out.
mapfile -t MACHINE_HAS < <(grep -v '^#' "$ROOT/scripts/device-machine.txt")

log() { echo "device-bundle: $*"; }
die() {
    echo "device-bundle: ERROR: $*" >&2
    exit "${2:-1}"
}

[[ -x "$CRIU_PREFIX/bin/criu" && -f "$CRIU_PREFIX/lib/python/pycriu/rpc_pb2.py" ]] \
    || die "no CRIU build at .criu (run: make criu)"
[[ -x "$INIT" ]] || die "no $INIT (run: make native)"
[[ "$(uname -m)" == x86_64 ]] \
    || die "CRIU and llfabric-init here are $(uname -m); the GPU machine is x86-64"

# pip's platform tags match exactly: name every manylinux up to the glibc that CRIU built here
# needs (2.35), which the machine must have anyway.
platforms=(--platform manylinux2014_x86_64)
for minor in $(seq 17 35); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
target=(--only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}")

tmp="$OUTDIR.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/wheels" "$tmp/bin" "$tmp/criu/bin" "$tmp/criu/libexec" "$tmp/criu/lib" \
    "$tmp/criu/python" "$tmp/all" "$tmp/machine"

# 1. The project's wheel, built from a copy of the sources so the checkout stays clean.
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
cp -r "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/fabric" "$ROOT/cli" "$src/"
# the wheel carries the prebuilt JupyterLab extension as data files
[ -f "$ROOT/labextension/dist/package.json" ] \
    || die "the JupyterLab extension is not built (run: make labextension)"
mkdir -p "$src/labextension" && cp -r "$ROOT/labextension/dist" "$src/labextension/"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/wheels" "$src" \
    || die "building the project's wheel failed"
own="$(ls "$tmp/wheels"/llfabric-*.whl)"

# 2. Its dependencies for CPython 3.12 on x86-64 Linux (the wheel file itself is named, so a
# project of the same name on the index cannot stand in for it). pip's own cache makes a
# rebuild quick.
log "pip download for CPython 3.12 manylinux x86_64"
if ! out="$("$PY" -m pip download -q "${target[@]}" -d "$tmp/all" "$own" 2>&1)"; then
    echo "$out" >&2
    offline='NewConnectionError|Max retries|Temporary failure in name resolution|unreachable'
    grep -qiE "$offline" <<<"$out" && die "the package index cannot be reached" 75
    die "pip download failed"
fi
for wheel in "$tmp"/all/*.whl; do
    # the distribution's name, normalised as PEP 503 does
    name="$(basename "$wheel" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')"
    if [[ "$name" == llfabric ]]; then
        continue
    elif [[ " ${MACHINE_HAS[*]} " == *" $name "* ]]; then
        mv "$wheel" "$tmp/machine/"
    else
        mv "$wheel" "$tmp/wheels/"
    fi
done
rm -rf "$tmp/all"

# 3. CRIU: the binary, the shared libraries it links beyond glibc, and pycriu.
cp "$CRIU_PREFIX/bin/criu" "$tmp/criu/libexec/criu"
ldd "$CRIU_PREFIX/bin/criu" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
        *) cp -L "$lib" "$tmp/criu/lib/" ;;
    esac
done
cat >"$tmp/criu/bin/criu" <<'EOF'
#!/bin/sh
# CRIU with the shared libraries that came with it (restored processes keep their own env).
here="$(dirname "$(readlink -f "$0")")/.."
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/libexec/criu" "$@"
EOF
chmod +x "$tmp/criu/bin/criu"
cp -r "$CRIU_PREFIX/lib/python/pycriu" "$tmp/criu/python/"
find "$tmp/criu/python" \( -name __pycache__ -o -name .gitignore \) -prune -exec rm -rf {} +
cp "$INIT" "$tmp/bin/"

# 4. The manifest: what the machine must still provide.
glibc() { objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -n1; }
{
    echo "llfabric device bundle, built $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        "from $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
    echo "python: CPython 3.12, x86-64 Linux"
    echo "pip target: ${target[*]}"
    echo "machine has: scripts/device-machine.txt (${#MACHINE_HAS[@]} packages)"
    echo "criu: $("$tmp/criu/bin/criu" --version | awk '/^Version:/ {print $2}')," \
        "needs $(glibc "$tmp/criu/libexec/criu")"
    echo "llfabric-init: needs $(glibc "$tmp/bin/llfabric-init")"
    echo "wheels:"
    (cd "$tmp/wheels" && ls ./*.whl | sed 's|^\./|  |')
} >"$tmp/MANIFEST"

rm -rf "$STANDINS" && mv "$tmp/machine" "$STANDINS"
size="$(du -sb "$tmp" | cut -f1)"
((size < LIMIT)) || die "the bundle would hold $((size >> 20)) MiB, over the 64 MiB a call takes"
rm -rf "$OUTDIR" && mv "$tmp" "$OUTDIR"
log "$OUTDIR: $(ls "$OUTDIR"/wheels | wc -l) wheels, criu, pycriu, llfabric-init:" \
    "$((size / 1024)) KiB of the 64 MiB a call can take"

#!/usr/bin/env bash
# Provision a CRIU (>= 4.0) that passes `criu check` on this kernel at .criu/bin/criu, and make
# pycriu (CRIU's Python RPC bindings) importable from the project venv.
#
# Bookworm only ships criu 3.17, which predates the kernels we run on, so unless a usable system
# criu (>= 4.0) exists we build upstream CRIU from the orig tarball that Debian's package sources
# serve for a newer suite (trixie: 4.1.1). Only a deb-src entry is added, so binary installs of
# bookworm packages are unaffected. Everything lands in the repo: sources/objects under
# build/criu/, the install under .criu/ (both git-ignored); nothing is installed over the system.
#
# Idempotent: with .criu/bin/criu and pycriu in place it only re-runs `criu check`.
# Env overrides: VENV (default: <repo>/.venv), CRIU_SUITE (default: trixie),
# CRIU_WANT (preferred upstream version, default: 4.1.1).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="$ROOT/.criu"
CRIU_BIN="$PREFIX/bin/criu"
PYDIR="$PREFIX/lib/python"
BUILD="$ROOT/build/criu"
VENV="${VENV:-$ROOT/.venv}"
VENV_PY="$VENV/bin/python"
SUITE="${CRIU_SUITE:-trixie}"
WANT="${CRIU_WANT:-4.1.1}"
SRC_LIST=/etc/apt/sources.list.d/llfabric-criu-src.sources
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# What building criu + lib/pycriu needs (docs, gnutls, nftables, amdgpu/cuda plugins skipped).
BUILD_DEPS=(gcc make pkg-config python3 xz-utils libc6-dev libprotobuf-dev libprotobuf-c-dev
    protobuf-c-compiler protobuf-compiler libnl-3-dev libcap-dev libnet1-dev libbsd-dev)

log() { echo "provision-criu: $*"; }
die() {
    echo "provision-criu: ERROR: $*" >&2
    exit 1
}

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "not root and no sudo; cannot run apt-get"
    SUDO=(sudo)
fi
apt_get() { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q "$@"; }

# "4.1.1" from `criu --version` ("Version: 4.1.1"); empty if it cannot run.
criu_version() { "$1" --version 2>/dev/null | awk '/^Version:/ {print $2; exit}' || true; }
is_v4plus() { [[ -n "$1" && "${1%%.*}" =~ ^[0-9]+$ && "${1%%.*}" -ge 4 ]]; }

# --- 1. the criu binary --------------------------------------------------------------------------

# The bookworm mirror this machine already uses (deb822 .sources or one-line .list format).
debian_mirror() {
    local codename f
    # shellcheck disable=SC1091
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -e "$f" && "$f" != "$SRC_LIST" ]] || continue
        awk -v cn="$codename" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " cn " ") && uris != "")
                    { split(uris, u, " "); print u[1]; found = 1; exit }
                types = suites = uris = ""
            }
            /^[[:space:]]*$/ { flush(); next }
            /^Types:/  { sub(/^Types:[[:space:]]*/, "");  types = $0 }
            /^Suites:/ { sub(/^Suites:[[:space:]]*/, ""); suites = $0 }
            /^URIs:/   { sub(/^URIs:[[:space:]]*/, "");   uris = $0 }
            END { if (!found) flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -e "$f" ]] || continue
        sed -nE "s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+${codename}[[:space:]].*/\2/p" "$f"
    done
}

# Newest criu source version in the apt cache matching $WANT, else the newest 4.x; empty if none.
criu_src_version() {
    local versions
    versions="$(apt-cache showsrc criu 2>/dev/null | awk '/^Version:/ {print $2}' | sort -Vr -u)"
    grep -m1 -E "^([0-9]+:)?${WANT//./\\.}-" <<<"$versions" \
        || grep -m1 -E '^([0-9]+:)?([4-9]|[1-9][0-9])\.' <<<"$versions" || true
}

ensure_deb_src() {
    local mirror want_list
    mirror="$(debian_mirror | grep -v -- '-security' | head -n1 || true)"
    [[ -n "$mirror" ]] || die "cannot find the Debian mirror in /etc/apt/sources.list{,.d}"
    want_list="Types: deb-src
URIs: $mirror
Suites: $SUITE
Components: main
Signed-By: $KEYRING"
    if [[ ! -f "$SRC_LIST" || "$(cat "$SRC_LIST")" != "$want_list" ]]; then
        log "adding deb-src $mirror $SUITE (source only; binary installs stay on bookworm)"
        printf '%s\n' "$want_list" | "${SUDO[@]}" tee "$SRC_LIST" >/dev/null
        apt_get update >/dev/null
    elif [[ -z "$(criu_src_version)" ]]; then
        apt_get update >/dev/null
    fi
}

install_build_deps() {
    local missing=() p
    for p in "${BUILD_DEPS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    log "apt-get install ${missing[*]}"
    apt_get install -y --no-install-recommends "${missing[@]}" >/dev/null \
        || { apt_get update >/dev/null && apt_get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
}

# build_criu [pycriu-only]: build from source; install criu to .criu/bin unless "pycriu-only".
build_criu() {
    local only="${1:-}" ver upstream tarball sha want_sha srcdir jobs
    command -v apt-get >/dev/null || die "no apt-get; install criu >= 4.0 by other means"
    ensure_deb_src
    ver="$(criu_src_version)"
    [[ -n "$ver" ]] || die "no criu 4.x source package in $SUITE"
    upstream="${ver#*:}"
    upstream="${upstream%-*}"
    tarball="$BUILD/criu_${upstream}.orig.tar.xz"
    want_sha="$(apt-cache showsrc criu | awk -v v="$ver" -v f="criu_${upstream}.orig.tar.xz" '
        /^Package:/ {ok = 0} /^Version:/ {ok = ($2 == v)}
        /^Checksums-Sha256:/ {s = 1; next} /^[^ ]/ {s = 0} ok && s && $3 == f {print $1; exit}')"
    [[ -n "$want_sha" ]] || die "no sha256 for criu_${upstream}.orig.tar.xz in the $SUITE Sources"
    mkdir -p "$BUILD"
    if [[ ! -f "$tarball" ]]; then
        log "downloading criu $ver source ($SUITE)"
        # Only the orig tarball is needed; tolerate a failure fetching the .dsc/debian.tar.
        (cd "$BUILD" && apt_get source --download-only -o APT::Sandbox::User=root \
            "criu=$ver" >/dev/null 2>&1) || true
        [[ -f "$tarball" ]] || die "apt-get source did not fetch criu_${upstream}.orig.tar.xz"
    fi
    sha="$(sha256sum "$tarball" | awk '{print $1}')"
    [[ "$sha" == "$want_sha" ]] \
        || { rm -f "$tarball"; die "sha256 mismatch for $tarball (removed; re-run)"; }
    srcdir="$BUILD/criu-$upstream"
    [[ -f "$srcdir/Makefile" ]] || tar -C "$BUILD" -xf "$tarball"
    [[ -f "$srcdir/Makefile" ]] || die "unexpected tarball layout (no criu-$upstream/Makefile)"

    install_build_deps
    jobs="$(nproc 2>/dev/null || echo 2)"
    local mk=(make -C "$srcdir" -j"$jobs" PREFIX="$PREFIX" SBINDIR="$PREFIX/bin"
        NO_GNUTLS=1 SKIP_PIP_INSTALL=1)
    log "building criu $upstream (make criu lib, ~1 min)"
    "${mk[@]}" criu lib >"$BUILD/build.log" 2>&1 \
        || { tail -n 40 "$BUILD/build.log" >&2; die "criu build failed (log: $BUILD/build.log)"; }
    if [[ "$only" != pycriu-only ]]; then
        rm -f "$CRIU_BIN"
        "${mk[@]}" install-criu >>"$BUILD/build.log" 2>&1 \
            || { tail -n 20 "$BUILD/build.log" >&2; die "criu install failed"; }
    fi

    # pycriu from the same tree, with the rpc/images *_pb2.py modules `make lib` generated.
    rm -rf "$PYDIR.tmp" && mkdir -p "$PYDIR.tmp"
    cp -r "$srcdir/lib/pycriu" "$PYDIR.tmp/"
    find "$PYDIR.tmp" \( -name Makefile -o -name '*.pyc' -o -name __pycache__ \) -prune \
        -exec rm -rf {} +
    rm -rf "$PYDIR" && mv "$PYDIR.tmp" "$PYDIR"
}

have=""
[[ -x "$CRIU_BIN" ]] && have="$(criu_version "$CRIU_BIN")"
if is_v4plus "$have"; then
    log "criu $have already at .criu/bin/criu"
else
    sys_criu="$(PATH="$PATH:/usr/sbin:/sbin" command -v criu || true)"
    sys_ver=""
    [[ -n "$sys_criu" ]] && sys_ver="$(criu_version "$sys_criu")"
    if is_v4plus "$sys_ver" && "${SUDO[@]}" "$sys_criu" check >/dev/null 2>&1; then
        log "using system criu $sys_ver ($sys_criu)"
        mkdir -p "$PREFIX/bin"
        ln -sfn "$sys_criu" "$CRIU_BIN"
    else
        [[ -n "$sys_ver" ]] && log "system criu $sys_ver unusable (need >= 4.0 passing check)"
        build_criu
    fi
fi

# --- 2. pycriu in the venv -----------------------------------------------------------------------

[[ -x "$VENV_PY" ]] || die "no venv at $VENV (create it first, e.g. via 'make test')"
pycriu_ok() { "$VENV_PY" -W error -c 'import pycriu, pycriu.images' >/dev/null 2>&1; }

if ! pycriu_ok; then
    "$VENV_PY" -c 'import google.protobuf' 2>/dev/null || {
        log "pip install protobuf into $VENV"
        "$VENV_PY" -m pip install -q --disable-pip-version-check 'protobuf>=4'
    }
    if [[ ! -f "$PYDIR/pycriu/rpc_pb2.py" ]]; then
        # A system criu was linked: pycriu comes from the distro (python3-pycriu) if at all.
        sys_py="$(/usr/bin/python3 -c 'import pycriu, os; print(os.path.dirname(
            os.path.dirname(pycriu.__file__)))' 2>/dev/null || true)"
        [[ -n "$sys_py" ]] || { log "no pycriu for the system criu; building one"; build_criu pycriu-only; }
        [[ -n "$sys_py" ]] && { mkdir -p "$PYDIR" && cp -r "$sys_py/pycriu" "$PYDIR/"; }
    fi
    site="$("$VENV_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$PYDIR" >"$site/llfabric-pycriu.pth"
    log "pycriu linked into $VENV ($site/llfabric-pycriu.pth)"
    pycriu_ok || {
        "$VENV_PY" -W error -c 'import pycriu, pycriu.images' || true
        die "pycriu still not importable from $VENV_PY"
    }
fi

# --- 3. verify -----------------------------------------------------------------------------------

if ! out="$("${SUDO[@]}" "$CRIU_BIN" check 2>&1)"; then
    echo "$out" >&2
    die "'$CRIU_BIN check' FAILED on kernel $(uname -r)"
fi
log "criu $(criu_version "$CRIU_BIN") OK (criu check: $(tail -n1 <<<"$out")), pycriu" \
    "$("$VENV_PY" -c 'import pycriu; print(pycriu.__version__)') in $VENV"

#!/usr/bin/env bash
# Provisioning of the GPU VM (see Vagrantfile), in three steps, each idempotent:
#
#   provision.sh system            packages, the NVIDIA driver (>= 570) and the CUDA runtime;
#                                  Vagrant reboots the guest afterwards (the driver's module)
#   provision.sh project DIR       CRIU 4.x with pycriu, cuda-checkpoint when NVIDIA publishes
#                                  it, a venv with PyTorch's CUDA build and the project
#   provision.sh check DIR         bench/device_check.sh: the GPU tests and benchmarks, into
#                                  /home/vagrant/device_check.txt
#
# Settings (environment):
#   NVIDIA_DRIVER   driver package from NVIDIA's CUDA repository (default nvidia-open: the open
#                   kernel modules, the current branch; Hopper and newer need them)
#   CUDA_VERSION    CUDA runtime package version (default 12-8: cuda-cudart-12-8)
#   TORCH_INDEX     PyTorch wheel index (default https://download.pytorch.org/whl/cu128)
#   TORCH_VERSION   default: the version requirements-dev.txt pins, in its CUDA build
#   CRIU_VERSION    upstream CRIU release built from source (default 4.1.1)
set -euo pipefail

MIN_DRIVER=570
NVIDIA_DRIVER="${NVIDIA_DRIVER:-nvidia-open}"
CUDA_VERSION="${CUDA_VERSION:-12-8}"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cu128}"
CRIU_VERSION="${CRIU_VERSION:-4.1.1}"
CUDA_CHECKPOINT_URL="https://raw.githubusercontent.com/NVIDIA/cuda-checkpoint/main/bin/x86_64_Linux/cuda-checkpoint"
RESULTS=/home/vagrant/device_check.txt

export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -q -o DPkg::Lock::Timeout=600)

log() { echo "provision: $*"; }
die() {
    echo "provision: ERROR: $*" >&2
    exit 1
}

system() {
    # the box's disk may be smaller than the volume libvirt made: grow the root filesystem
    if command -v growpart >/dev/null; then
        root="$(findmnt -no SOURCE /)"
        disk="/dev/$(lsblk -no PKNAME "$root")"
        if growpart "$disk" "${root##*[!0-9]}" >/dev/null 2>&1; then
            resize2fs "$root" >/dev/null 2>&1 || true
        fi
    fi
    "${APT[@]}" update
    "${APT[@]}" install -y --no-install-recommends build-essential dkms "linux-headers-$(uname -r)" \
        pciutils curl ca-certificates git python3-venv python3-dev pkg-config xz-utils \
        libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler \
        libnl-3-dev libcap-dev libnet1-dev libbsd-dev
    lspci -d 10de: | grep -q . \
        || die "no NVIDIA device on the guest's PCI bus: is LLFABRIC_GPU_PCI the GPU, bound to vfio-pci?"
    # NVIDIA's CUDA repository for this Ubuntu release: drivers and the CUDA runtime
    # shellcheck disable=SC1091
    repo="$(. /etc/os-release && echo "ubuntu${VERSION_ID//./}")"
    if ! dpkg -s cuda-keyring >/dev/null 2>&1; then
        curl -fsSL -o /tmp/cuda-keyring.deb \
            "https://developer.download.nvidia.com/compute/cuda/repos/$repo/x86_64/cuda-keyring_1.1-1_all.deb"
        dpkg -i /tmp/cuda-keyring.deb
        "${APT[@]}" update
    fi
    "${APT[@]}" install -y "$NVIDIA_DRIVER" "cuda-cudart-$CUDA_VERSION"
    log "driver installed; the guest reboots to load it"
}

check_driver() {
    local version
    version="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)" \
        || die "nvidia-smi fails after the reboot: see 'dmesg | grep -i nvidia'"
    [[ "${version%%.*}" -ge $MIN_DRIVER ]] \
        || die "driver $version predates $MIN_DRIVER (the CUDA checkpoint API): set NVIDIA_DRIVER"
    log "NVIDIA driver $version: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
}

# CRIU from upstream's release tarball, where the project looks for it: DIR/.criu/bin/criu and
# DIR/.criu/lib/python/pycriu (as scripts/provision-criu.sh lays it out on Debian hosts).
build_criu() {
    local dir="$1" src=/opt/criu-$CRIU_VERSION
    if [[ "$("$dir/.criu/bin/criu" --version 2>/dev/null | awk '/^Version:/ {print $2}')" \
            == "$CRIU_VERSION" ]]; then
        return
    fi
    if [[ ! -f "$src/Makefile" ]]; then
        mkdir -p "$src"
        curl -fsSL "https://github.com/checkpoint-restore/criu/archive/refs/tags/v$CRIU_VERSION.tar.gz" \
            | tar -xz -C "$src" --strip-components=1
    fi
    log "building CRIU $CRIU_VERSION"
    make -C "$src" -j"$(nproc)" PREFIX="$dir/.criu" SBINDIR="$dir/.criu/bin" NO_GNUTLS=1 \
        SKIP_PIP_INSTALL=1 criu lib >"$src/build.log" 2>&1 \
        || { tail -n 40 "$src/build.log"; die "CRIU build failed"; }
    make -C "$src" PREFIX="$dir/.criu" SBINDIR="$dir/.criu/bin" NO_GNUTLS=1 install-criu \
        >>"$src/build.log" 2>&1 || die "CRIU install failed"
    rm -rf "$dir/.criu/lib/python" && mkdir -p "$dir/.criu/lib/python"
    cp -r "$src/lib/pycriu" "$dir/.criu/lib/python/"
}

cuda_checkpoint() {
    command -v cuda-checkpoint >/dev/null && return
    if curl -fsSL -o /usr/local/bin/cuda-checkpoint "$CUDA_CHECKPOINT_URL"; then
        chmod 755 /usr/local/bin/cuda-checkpoint
        log "cuda-checkpoint installed from NVIDIA/cuda-checkpoint"
    else
        rm -f /usr/local/bin/cuda-checkpoint
        log "cuda-checkpoint not available: the driver API through cuda-python is used"
    fi
}

project() {
    local dir="$1" torch
    cd "$dir"
    check_driver
    build_criu "$dir"
    cuda_checkpoint
    torch="${TORCH_VERSION:-$(sed -n 's/^torch==\([^ ]*\).*/\1/p' requirements-dev.txt)}"
    [[ -x .venv/bin/python ]] || python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -U pip
    # PyTorch's CUDA build (not the CPU wheel the CI machines pin), then the project
    .venv/bin/pip install -q --disable-pip-version-check "torch==$torch" --index-url "$TORCH_INDEX"
    # what the test modules import (pytest collects them all to select -m gpu), torch excepted
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test,gpu]' \
        -r <(grep -v '^torch==' requirements-dev.txt)
    .venv/bin/python -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))'
    bash scripts/provision-criu.sh  # links pycriu into the venv and runs `criu check`
    make -C native
}

check() {
    cd "$1"
    local status=0
    bash bench/device_check.sh "$RESULTS" || status=$?
    chown vagrant: "$RESULTS" 2>/dev/null || true
    log "results in $RESULTS (vagrant ssh -c 'cat device_check.txt')"
    return "$status"
}

case "${1:-}" in
    system) system ;;
    project) project "${2:?project DIR}" ;;
    check) check "${2:?check DIR}" ;;
    *) die "usage: provision.sh system | project DIR | check DIR" ;;
esac

#!/usr/bin/env bash
# System packages the test suite needs beyond the venv.  Idempotent: does
# nothing when the tools are already on PATH, so `make test` stays fast.
#
# graphviz: three corpus notebooks render graphs through the `dot` binary
# (the python `graphviz` package only wraps it).
# chromium: the JupyterLab browser tests drive it through Playwright (no browser download).
set -euo pipefail

if command -v dot >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "provision-sysdeps: 'dot' (graphviz) or chromium is missing and apt-get is" \
         "unavailable; install them with your system package manager" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
# Wait for a concurrent apt/dpkg run (e.g. another provisioning script)
# instead of failing on its lock.
APT=(apt-get -o DPkg::Lock::Timeout=300)
# Install straight away; refresh the package index only if that fails
# (fresh containers often ship without one).
$SUDO "${APT[@]}" install -y --no-install-recommends graphviz chromium \
    || { $SUDO "${APT[@]}" update \
         && $SUDO "${APT[@]}" install -y --no-install-recommends graphviz chromium; }

command -v dot >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1

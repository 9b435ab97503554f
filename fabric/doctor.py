"""`llfabric doctor`: whether this host can serve, one check at a time, each with its fix.

A check that fails means the server cannot start or keep state (its directories, its disk); one
that warns means it serves with less (no CRIU: no templates or cool workers; a driver without the
checkpoint API: kept workers stay on their GPU). Checks that do not apply (GPUs on a CPU host)
say so and are skipped.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .config import Config
from .errors import UnsafePath
from .pool import criu, cuda, gpus
from .private import check_dir
from .users import effective_capabilities

CHECKPOINT_DRIVER = 570  # cuCheckpointProcess*: park a CUDA process off its GPU
MOVING_DRIVER = 580  # restore onto another GPU than the one it left
LOW_DISK = 1 << 30  # below this free, a commit of any real state fails
CRIU_MAJOR = 4
CRIU_SOURCE = "https://criu.org/Installation"
DISTRIBUTION = "llfabric"  # the distribution whose import package is `fabric`

# Linux capability bits (linux/capability.h) the server uses, and what for.
CAPABILITIES = {
    0: ("CAP_CHOWN", "give each user their part of the store (users = \"separate\")"),
    1: ("CAP_DAC_OVERRIDE", "read and collect what each user's workers stored"),
    6: ("CAP_SETGID", "run each user's cells under their groups"),
    7: ("CAP_SETUID", "run each user's cells as that user"),
    19: ("CAP_SYS_PTRACE", "CRIU dumps workers"),
    21: ("CAP_SYS_ADMIN", "CRIU restores templates and cool workers"),
    40: ("CAP_CHECKPOINT_RESTORE", "CRIU without all of CAP_SYS_ADMIN (kernel 5.9+)"),
}


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # ok, warn (serves with less), fail (cannot serve), skip (does not apply)
    detail: str
    fix: str = ""


def run(config: Config) -> list[Check]:
    """Every check, in the order an operator would fix them."""
    found: list[Check] = []
    for check in _CHECKS:
        found.extend(check(config))
    return found


def serves(checks: list[Check]) -> bool:
    return all(c.verdict != "fail" for c in checks)


def clashing_distributions(path: Iterable[str] | None = None) -> list[str]:
    """The installed distributions other than llfabric that also put files in a top-level
    `fabric` package (Fabric, the SSH tool, is one): installed together, one overwrites the
    other's files. `path` is where to look (default sys.path)."""
    found = set()
    for dist in metadata.distributions(**({} if path is None else {"path": list(path)})):
        name = dist.metadata["Name"] or ""
        if name.lower() == DISTRIBUTION:
            continue
        top = (dist.read_text("top_level.txt") or "").split()
        if "fabric" in top or any(file.parts[:1] == ("fabric",) for file in dist.files or ()):
            found.add(name)
    return sorted(found)


def _name_clash(config: Config) -> Iterator[Check]:
    others = clashing_distributions()
    if not others:
        yield Check("import name", "ok", "`fabric` is llfabric's alone")
        return
    yield Check("import name", "fail", f"{', '.join(others)} also install(s) a `fabric` package: "
                "one overwrites the other's files, breaking both",
                "install llfabric in a virtual environment of its own (python3 -m venv), "
                f"then `pip uninstall {' '.join(others)}` there and reinstall llfabric")


def _kernel(config: Config) -> Iterator[Check]:
    release = platform.release()
    major, minor = (int(part) for part in release.split(".")[:2])
    if (major, minor) < (5, 9):
        yield Check("kernel", "warn", f"Linux {release}: no CAP_CHECKPOINT_RESTORE, so CRIU "
                    "needs all of CAP_SYS_ADMIN", "a 5.9 or later kernel")
    else:
        yield Check("kernel", "ok", f"Linux {release}")


def _criu(config: Config) -> Iterator[Check]:
    binary = criu.criu_binary()
    if binary is None:
        yield Check("criu", "warn", "no CRIU: no templates or cool workers, cells start from "
                    "zygotes", f"install CRIU {CRIU_MAJOR}.x (a distribution's criu package if "
                    f"it is {CRIU_MAJOR}.x, else built from source: {CRIU_SOURCE}; a checkout's "
                    f"`make criu` builds 4.1.1), or set {criu.CRIU} to its path")
        return
    version = _output([str(binary), "--version"]).partition("Version:")[2].split()
    version_text = version[0] if version else "unknown"
    if not version or int(version_text.split(".")[0]) < CRIU_MAJOR:
        yield Check("criu", "warn", f"CRIU {version_text} at {binary}: older than "
                    f"{CRIU_MAJOR}.0", f"CRIU {CRIU_MAJOR}.x (`make criu` builds 4.1.1)")
        return
    if os.geteuid() != 0:
        yield Check("criu", "warn", f"CRIU {version_text} at {binary}; `criu check` needs root",
                    "run the server as root (or with the capabilities below)")
        return
    said = _output([str(binary), "check"])
    if "Looks good" in said:
        yield Check("criu", "ok", f"CRIU {version_text} at {binary}; criu check: Looks good.")
    else:
        yield Check("criu", "warn", f"CRIU {version_text} at {binary}; criu check: "
                    f"{said.strip().splitlines()[-1] if said.strip() else 'no answer'}",
                    "a kernel CRIU supports (`criu check --all` tells what is missing)")


def _helpers(config: Config) -> Iterator[Check]:
    try:
        import pycriu  # noqa: F401  (provisioned with CRIU by scripts/provision-criu.sh)
        yield Check("pycriu", "ok", "importable")
    except ImportError as exc:
        yield Check("pycriu", "warn", f"not importable ({exc}): no templates or cool workers",
                    "CRIU's Python bindings (lib/pycriu of its source, built with it): a "
                    "checkout's `make criu` provisions them into the venv")
    init = criu.init_binary()
    if init is None:
        yield Check("llfabric-init", "warn", "missing: no templates or cool workers",
                    f"a wheel carries it; in a checkout `make native`; or set {criu.INIT}")
    else:
        yield Check("llfabric-init", "ok", str(init))


def _gpus(config: Config) -> Iterator[Check]:
    version = gpus.driver_version()
    if version is None:
        yield Check("nvidia", "skip", "no NVIDIA driver: CPU slots stand in for GPUs "
                    f"(a GPU host needs driver {CHECKPOINT_DRIVER}+ and `pip install "
                    "llfabric[gpu]`)")
        return
    major = int(version.split(".")[0])
    if major < CHECKPOINT_DRIVER:
        yield Check("nvidia driver", "warn", f"{version}: no checkpoint API, kept workers stay "
                    "on their GPU between cells", f"driver {CHECKPOINT_DRIVER} or later")
    elif major < MOVING_DRIVER:
        yield Check("nvidia driver", "warn", f"{version}: a parked worker resumes only on the "
                    "GPU it left", f"driver {MOVING_DRIVER} or later to move it to another")
    else:
        yield Check("nvidia driver", "ok", version)
    driver = cuda.find_driver()
    yield (Check("checkpoint", "ok", type(driver).__name__) if driver is not None else
           Check("checkpoint", "warn", "neither cuda-python's checkpoint API nor "
                 "cuda-checkpoint: kept workers stay on their GPU",
                 "pip install cuda-python, or put cuda-checkpoint on PATH"))
    for gpu in gpus.discover():
        detail = f"{gpu.name}, {gpu.memory_total / 2**30:.0f} GiB"
        yield (Check(f"gpu {gpu.index}", "warn", f"{detail}, MIG on: leases are whole GPUs",
                     f"nvidia-smi -i {gpu.index} -mig 0") if gpus.mig_enabled(gpu) else
               Check(f"gpu {gpu.index}", "ok", detail))


def _disk(config: Config) -> Iterator[Check]:
    place = Path(config.store)
    while not place.exists():
        place = place.parent
    usage = shutil.disk_usage(place)
    used = 100 * usage.used / usage.total
    detail = f"{usage.free / 2**30:.1f} GiB free on the store's disk ({used:.0f}% used)"
    if usage.free < LOW_DISK:
        yield Check("store disk", "fail", detail, "free space, or point `store` elsewhere")
    elif config.disk_pressure and used >= config.disk_pressure:
        yield Check("store disk", "warn", detail + f", past disk_pressure "
                    f"({config.disk_pressure}%): every commit runs retention",
                    "free space, or lower keep_versions")
    else:
        yield Check("store disk", "ok", detail)


def _directories(config: Config) -> Iterator[Check]:
    for name, path in (("store dir", config.store), ("runtime dir", config.runtime_dir)):
        if not Path(path).exists():
            yield Check(name, "ok", f"{path}: made 0700 at start")
            continue
        try:
            check_dir(Path(path), owners={os.geteuid()}, closed=0o022)
        except UnsafePath as exc:
            yield Check(name, "fail", exc.message, f"chown to this user and chmod 0700 {path}, "
                        "or configure another")
        else:
            yield Check(name, "ok", f"{path}: ours, closed to others")


def _capabilities(config: Config) -> Iterator[Check]:
    effective = effective_capabilities()
    held = {bit for bit in CAPABILITIES if effective >> bit & 1}
    if os.geteuid() == 0 and held == set(CAPABILITIES):
        yield Check("capabilities", "ok", "root with every capability the server uses")
        return
    for bit, (name, use) in CAPABILITIES.items():
        if bit not in held:
            yield Check("capabilities", "warn", f"no {name}: cannot {use}",
                        "run the server as root (see the operator guide, \"A shared host\")")


def _output(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return done.stdout + done.stderr


_CHECKS: list[Callable[[Config], Iterator[Check]]] = [
    _name_clash, _kernel, _criu, _helpers, _gpus, _disk, _directories, _capabilities]

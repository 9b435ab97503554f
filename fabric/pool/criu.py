"""Thin, blocking wrappers over pycriu (CRIU's RPC in `swrk` mode): dump a tree, restore it.

pycriu forks `criu swrk` per request and talks protobuf over a socketpair; callers in the
server's loop run these functions in a thread. The images directory is passed as an fd of ours
(`images_dir_fd`): CRIU 4.1 rejects a plain `images_dir` path in swrk mode.

Restores never set `auto_dedup` or lazy pages: both consume the images (auto_dedup punches
holes in the page files as it reads them), and a template's images are restored many times.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from ..errors import FabricError

_REPO = Path(__file__).resolve().parents[2]
_NATIVE = _REPO / "build" / "native"


class CheckpointError(FabricError):
    """CRIU refused or failed a dump or restore; `log` holds the tail of CRIU's own log."""

    kind = "checkpoint"


def criu_binary() -> Path | None:
    """`LLFABRIC_CRIU`, else the CRIU provisioned into the checkout, else `criu` on PATH."""
    for candidate in (os.environ.get("LLFABRIC_CRIU"), _REPO / ".criu" / "bin" / "criu",
                      shutil.which("criu")):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def init_binary() -> Path | None:
    """`LLFABRIC_INIT`, else the pid-1 init built by `make -C native`."""
    for candidate in (os.environ.get("LLFABRIC_INIT"), _NATIVE / "llfabric-init"):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def unavailable() -> str | None:
    """Why dumps and restores cannot work here, or None when they can."""
    if os.geteuid() != 0:
        return "CRIU needs root"
    if criu_binary() is None:
        return "no criu binary (run `bash scripts/provision-criu.sh`)"
    if init_binary() is None:
        return "no llfabric-init (run `make -C native`)"
    try:
        import pycriu  # noqa: F401  (provisioned into the venv by scripts/provision-criu.sh)
    except ImportError as exc:
        return f"pycriu is not importable: {exc}"
    return None


def _log_tail(images: Path, name: str, lines: int = 15) -> str:
    try:
        return "\n".join((images / name).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _call(verb: str, images: Path, log_name: str, **opts: object):
    import pycriu

    fd = os.open(images, os.O_RDONLY | os.O_DIRECTORY)
    try:
        criu = pycriu.criu()
        binary = criu_binary()
        if binary is None:
            raise CheckpointError("no criu binary", images=str(images))
        criu.use_binary(str(binary))
        criu.opts.images_dir_fd = fd
        criu.opts.log_file = log_name
        criu.opts.log_level = 4
        for key, value in opts.items():
            setattr(criu.opts, key, value)
        try:
            return getattr(criu, verb)()
        except pycriu.CRIUException as exc:
            raise CheckpointError(f"criu {verb} failed: {exc}", images=str(images),
                                  log=_log_tail(images, log_name)) from exc
    finally:
        os.close(fd)


def dump(pid: int, images: Path, log_name: str = "dump.log") -> None:
    """Dump the tree rooted at `pid` into `images`; CRIU kills the tree once it is written."""
    images.mkdir(parents=True, exist_ok=True)
    _call("dump", images, log_name, pid=pid, leave_running=False)


def restore(images: Path, log_name: str) -> int:
    """Restore the tree in `images` as a child of this process; return its root's pid.

    A tree dumped as the init of its own PID namespace comes back in a new one, so the same
    images can be restored many times at once.
    """
    response = _call("restore", images, log_name, rst_sibling=True)
    return int(response.pid)


def remove(images: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(images)

"""Thin, blocking wrappers over pycriu (CRIU's RPC in `swrk` mode): dump a tree, restore it.

pycriu forks `criu swrk` per request and talks protobuf over a socketpair; callers in the
server's loop run these functions in a thread. The images directory is passed as an fd of ours
(`images_dir_fd`): CRIU 4.1 rejects a plain `images_dir` path in swrk mode.

Restores never set `auto_dedup` or lazy pages: both consume the images (auto_dedup punches
holes in the page files as it reads them), and a template's images are restored many times.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import psutil

from ..errors import CheckpointError

# the source checkout this runs from, where `make criu` and `make native` put their builds
# (installed from a wheel, nothing is there)
_CHECKOUT = Path(__file__).resolve().parents[2]
# where a wheel's build step put its llfabric-init (setup.py), beside this module
_PACKAGED_INIT = Path(__file__).resolve().parent / "llfabric-init"
CRIU, INIT = "LLFABRIC_CRIU", "LLFABRIC_INIT"  # the settings: paths of the binaries
GHOST_LIMIT = 1 << 31  # bytes of an unlinked file a dump may keep
_MAPPED = "mapped"  # the images' links to the files the tree mapped
# a tree is restored into the restorer's cgroups, not those it was dumped from: the server
# moves it into a cage of its own (`contain`), and the dumped ones may be gone or another host's
_CGROUPS_IGNORED = 0


def locate(configured: str, name: str, *built: Path) -> Path | None:
    """The binary `configured` names, if set; else the first `built` one (a checkout's build,
    vetted by the Makefile: a distro's criu on PATH may predate the kernel; then the package's
    own); else `name` on PATH. None when that is not an executable: a setting that is wrong
    must not quietly fall back to another.

    The settings are environment variables (LLFABRIC_*, as the configuration's), read here:
    the pool sits below the configuration and is not handed one."""
    if configured:
        path = Path(configured).expanduser()
        return path if path.is_file() and os.access(path, os.X_OK) else None
    for candidate in (*built, shutil.which(name)):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def criu_binary() -> Path | None:
    """The CRIU to run: LLFABRIC_CRIU, else `make criu`'s build, else PATH's."""
    return locate(os.environ.get(CRIU, ""), "criu", _CHECKOUT / ".criu" / "bin" / "criu")


def init_binary() -> Path | None:
    """The workers' pid-1 init: LLFABRIC_INIT, else `make native`'s build, else the one a
    wheel carries, else PATH's `llfabric-init`."""
    return locate(os.environ.get(INIT, ""), "llfabric-init",
                  _CHECKOUT / "build" / "native" / "llfabric-init", _PACKAGED_INIT)


def unavailable() -> str | None:
    """Why dumps and restores cannot work here, or None when they can."""
    if os.geteuid() != 0:
        return "CRIU needs root"
    if criu_binary() is None:
        return _missing(CRIU, "criu", "`make criu`")
    if init_binary() is None:
        return _missing(INIT, "llfabric-init", "`make native`")
    try:
        import pycriu  # noqa: F401  (provisioned into the venv by scripts/provision-criu.sh)
    except ImportError as exc:
        return f"pycriu is not importable: {exc}"
    return None


def _missing(variable: str, name: str, build: str) -> str:
    if os.environ.get(variable):
        return f"{variable}={os.environ[variable]} is not an executable file"
    return f"no {name} binary: set {variable}, put it on PATH, or run {build} in a checkout"


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
        options = criu.opts
        assert options is not None, "pycriu's constructor makes them"
        options.images_dir_fd = fd
        options.log_file = log_name
        options.log_level = 4
        for key, value in opts.items():
            setattr(options, key, value)
        try:
            return getattr(criu, verb)()
        except pycriu.CRIUException as exc:
            raise CheckpointError(f"criu {verb} failed: {exc}", images=str(images),
                                  log=_log_tail(images, log_name)) from exc
    finally:
        os.close(fd)


def dump(pid: int, images: Path, log_name: str = "dump.log", keep_under: Path | None = None
         ) -> None:
    """Dump the tree rooted at `pid` into `images`; CRIU kills the tree once it is written.
    `keep_under`: a folder whose files the tree maps (a worker's arrays are mappings of the
    store's chunk files) and which may be unlinked before the restore: the images keep links."""
    images.mkdir(parents=True, exist_ok=True)
    if keep_under is not None:
        _keep_mapped(pid, images / _MAPPED, keep_under)
    # a file unlinked before the dump goes into the images whole (up to 1 MiB by default)
    _call("dump", images, log_name, pid=pid, leave_running=False, ghost_limit=GHOST_LIMIT,
          manage_cgroups_mode=_CGROUPS_IGNORED)


def restore(images: Path, log_name: str) -> int:
    """Restore the tree in `images` as a child of this process; return its root's pid.

    A tree dumped as the init of its own PID namespace comes back in a new one, so the same
    images can be restored many times at once.
    """
    _put_back(images / _MAPPED)  # CRIU opens a mapped file by its path
    response = _call("restore", images, log_name, rst_sibling=True,
                     manage_cgroups_mode=_CGROUPS_IGNORED)
    return int(response.pid)


def _mapped_files(pid: int, root: Path) -> set[str]:
    """The files under `root` that the tree rooted at `pid` maps."""
    prefix, found = f"{root}/", set()
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        with contextlib.suppress(psutil.Error, OSError):
            for region in process.memory_maps(grouped=True):
                if region.path.startswith(prefix) and os.path.isfile(region.path):
                    found.add(region.path)
    return found


def _keep_mapped(pid: int, kept: Path, root: Path) -> None:
    """Link (else copy) the files under `root` the tree maps into `kept`, with their paths."""
    kept.mkdir()
    paths = {}
    for i, path in enumerate(sorted(_mapped_files(pid, root))):
        try:
            os.link(path, kept / str(i))
        except FileNotFoundError:  # unlinked meanwhile: the dump keeps its bytes
            continue
        except OSError:  # another file system
            shutil.copyfile(path, kept / str(i))
        paths[str(i)] = path
    (kept / "paths.json").write_text(json.dumps(paths))


def _put_back(kept: Path) -> None:
    """Link back the mapped files that were unlinked since the dump (content-addressed blobs:
    the same bytes under the same name)."""
    index = kept / "paths.json"
    if not index.exists():
        return
    for name, path in json.loads(index.read_text()).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.link(kept / name, path)


def remove(images: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(images)

"""Thin, blocking wrappers over pycriu (CRIU's RPC in `swrk` mode): dump a tree, restore it.

pycriu forks `criu swrk` per request and talks protobuf over a socketpair; callers in the
server's loop run these functions in a thread. The images directory is passed as an fd of ours
(`images_dir_fd`): CRIU 4.1 rejects a plain `images_dir` path in swrk mode. A CRIU that runs in
another PID namespace cannot reach our fds through /proc: it is given the fd itself, and named
`images_dir` as /proc/self/fd/N, a link, which 4.1 does resolve.

A tree is restored under the pids it had. A worker's tree restored as it was dumped would need
those pids free on this host; so a tree that is not a namespace of its own is restored in a
`Nest`: a PID namespace of its own with its own /proc, whose init runs the restoring CRIU and
then adopts the tree. Its processes see the pids they had, CUDA included (it needs a /proc of
its own namespace); this host sees others. Dumped again, such a tree is dumped from inside its
namespaces, so its images are again a plain tree, restorable in any nest.

Why not give every forked worker that namespace from its fork: the worker would need a mount
namespace of its own for its /proc, and the files it inherited from its zygote (its
interpreter, its libraries) stay on the mounts of the zygote's mount namespace, which CRIU does
not find in the worker's and refuses to dump.

Restores never set `auto_dedup` or lazy pages: both consume the images (auto_dedup punches
holes in the page files as it reads them), and a template's images are restored many times.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
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


def _binaries(images: Path) -> tuple[str, str]:
    criu, init = criu_binary(), init_binary()
    if criu is None or init is None:
        raise CheckpointError("no criu or llfabric-init binary", images=str(images))
    return str(criu), str(init)


def _call(verb: str, images: Path, log_name: str, swrk: socket.socket | None = None,
          images_fd: int | None = None, **opts: object):
    """CRIU's `verb` on `images`: a `criu swrk` of pycriu's own, or the one at the other end
    of `swrk`, which holds `images_fd`, the images' folder."""
    import pycriu

    fd = os.open(images, os.O_RDONLY | os.O_DIRECTORY) if swrk is None else -1
    try:
        criu = pycriu.criu()
        if swrk is None:
            criu.use_binary(_binaries(images)[0])
        else:
            criu.use_fd(swrk.fileno())
        options = criu.opts
        assert options is not None, "pycriu's constructor makes them"
        options.images_dir_fd = fd
        if images_fd is not None:
            options.images_dir = f"/proc/self/fd/{images_fd}"
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
        if fd >= 0:
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
    inner = _pid_inside(pid)
    if inner is None:
        _call("dump", images, log_name, pid=pid, leave_running=False, ghost_limit=GHOST_LIMIT,
              manage_cgroups_mode=_CGROUPS_IGNORED)
        return
    # From inside its namespaces (a nest's): CRIU kills the tree only once it has answered,
    # since the tree's end ends the namespace, and CRIU in it.
    swrk, images_fd, helper = _swrk(images, "--in", str(pid))
    try:
        with swrk:
            _call("dump", images, log_name, swrk, images_fd, pid=inner, leave_running=True,
                  ghost_limit=GHOST_LIMIT, manage_cgroups_mode=_CGROUPS_IGNORED)
    finally:
        os.waitpid(helper, 0)  # it ends with its CRIU, which leaves once its socket closes
    os.kill(pid, signal.SIGKILL)


def restore(images: Path, log_name: str, store: Path | None = None) -> int:
    """Restore the tree in `images`, the init of its own PID namespace (a template's), as a
    child of this process; return its root's pid. It comes back in a new namespace, so the same
    images can be restored many times at once. `store`: this host's (see `_put_back`)."""
    with _put_back(images / _MAPPED, store):  # CRIU opens a mapped file by its path
        response = _call("restore", images, log_name, rst_sibling=True,
                         manage_cgroups_mode=_CGROUPS_IGNORED)
    return int(response.pid)


@dataclass(frozen=True)
class Nest:
    """A tree restored in a PID namespace of its own (see the module's notes): `init` is this
    process's child, which forwards signals to the tree's root, `root`, and exits with its
    status (128 + the signal that killed it); both are pids as this host sees them."""

    init: int
    root: int


class Nesting:
    """A nest being made for the tree in `images`, dumped on a host whose store was `store`'s
    folder or another: its init runs a `criu swrk` that restores the tree when asked
    (`restore`, blocking, from any thread). The init dies with the thread that made it
    (PR_SET_PDEATHSIG): make it in one that lives as long as the server."""

    def __init__(self, images: Path, store: Path) -> None:
        self.images, self.store = images, store
        self.swrk, self.images_fd, self.init = _swrk(images, "--pidns", "--proc", "--adopt")

    def restore(self, log_name: str) -> Nest:
        try:
            # the socket closed ends the restorer: the init adopts what it restored
            with self.swrk, _put_back(self.images / _MAPPED, self.store):
                response = _call("restore", self.images, log_name, self.swrk, self.images_fd,
                                 rst_sibling=True, manage_cgroups_mode=_CGROUPS_IGNORED)
            root = next((child for child in _children(worker_of(self.init))
                         if _is_inside(child, response.pid)), None)
            if root is None:
                raise CheckpointError(f"the restored tree's root ({response.pid} in its "
                                      "namespace) is not in its nest", images=str(self.images))
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init, signal.SIGKILL)
            os.waitpid(self.init, 0)
            raise
        return Nest(self.init, root)


def _swrk(images: Path, *how: str) -> tuple[socket.socket, int, int]:
    """Start a `criu swrk` run by llfabric-init `how` (in a nest it makes, or in another
    process's namespaces), holding the images' folder: our end of its socket (closing it ends
    that CRIU), its fd of the folder, the init's pid."""
    criu, init = _binaries(images)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    folder = os.open(images, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for fd in (theirs.fileno(), folder):
            os.set_inheritable(fd, True)
        pid = os.posix_spawn(init, [init, *how, criu, "swrk", str(theirs.fileno())],
                             os.environ, setsid=True,
                             file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
        os.close(folder)
    return mine, folder, pid


def _pid_inside(pid: int) -> int | None:
    """The pid `pid` has in its own PID namespace when that is not ours and it is not that
    namespace's init (CRIU dumps it from inside); None otherwise."""
    try:
        with open(f"/proc/{pid}/status") as status:
            line = next(ln for ln in status if ln.startswith("NSpid:"))
    except (OSError, StopIteration) as exc:
        raise CheckpointError(f"process {pid} is gone: {exc}") from exc
    inner = int(line.split()[-1])
    return None if len(line.split()) == 2 or inner == 1 else inner


def _is_inside(pid: int, inner: int) -> bool:
    """Whether `pid` is `inner` in its own namespace (False once gone: the nest's restorer
    leaves as it is looked at)."""
    try:
        return _pid_inside(pid) == inner
    except CheckpointError:
        return False


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


def worker_of(pid: int) -> int:
    """The one child of an llfabric-init (or of the launcher that made the namespace)."""
    found = _children(pid)
    if len(found) != 1:
        raise CheckpointError(f"llfabric-init {pid} has children {found}, not one")
    return found[0]


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


@contextlib.contextmanager
def _put_back(kept: Path, store: Path | None) -> Iterator[None]:
    """Link back, for the restore in the block, the mapped files that were unlinked since the
    dump (content-addressed blobs: the same bytes under the same name), at the paths they had
    where they were dumped. Those in this host's `store` stay, for its gc to collect; those
    elsewhere (another host's store) are taken away after the block, with the folders made for
    them: the restored tree maps them, and this host's disk is left as it was."""
    index = kept / "paths.json"
    made: list[Path] = []  # files and folders, each after the folder it is in
    try:
        for name, path in json.loads(index.read_text()).items() if index.exists() else ():
            target = Path(path)
            ours = store is not None and target.is_relative_to(store)
            missing = [folder for folder in target.parents if not folder.exists()]
            for folder in reversed(missing):
                folder.mkdir()
            try:
                os.link(kept / name, target)
            except FileExistsError:
                continue
            except OSError:  # another file system (an image carried from another host)
                shutil.copyfile(kept / name, target)
            if not ours:
                made += [*reversed(missing), target]
        yield
    finally:
        for path in reversed(made):
            with contextlib.suppress(OSError):  # a folder others wrote into since stays
                if path.is_dir():
                    path.rmdir()
                else:
                    path.unlink()


def remove(images: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(images)

"""Containment: every worker's processes in a cgroup of their own, under one per user.

A cell may start processes that leave its worker (`subprocess.Popen`, a daemon that double
forks, `os.fork`); they are the worker's all the same. Each worker gets a cgroup (its cage),
made before the worker runs anything of a session and entered by the worker, its init and any
process a restore brings back with it; whatever they start is born inside it. Killing a cage
kills them all: when its cell is stopped, when the worker is retired or dies, when the server
stops. The layout, in each cgroup hierarchy used, below the server's own cgroup:

    llfabric-<server>-<pool>/u-<user>/w<worker id>

where <server> is the server's pid after its PID namespace's inode: servers in PID namespaces
of their own (containers, a cluster's test hosts) share this machine's cgroups, not their pids.

`worker_memory` limits each cage's memory (the kernel's OOM killer ends what passes it, and the
cage's OOM count tells the worker's death apart from a plain SIGKILL), `user_pids` the
processes of all the cages of one user, so that a fork bomb stops at its own user.

Hierarchies: cgroup v2 where its memory and pids controllers can be delegated to us; else
cgroup v1's memory and pids hierarchies (a hybrid host), with v2's `cgroup.kill` where its
unified hierarchy is mounted. Where no hierarchy can be written (not root, a container without
delegation), a cage falls back to the worker's process group (each worker is a session leader)
and the descendants found under it: no limits, and a child that left both escapes.

A server killed outright cannot kill its cages: a warden process it starts (`warden`) waits
for the server's end on a pipe and kills and removes what is left under its cgroups.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..errors import ConfigError

log = logging.getLogger(__name__)

LIMITED = ("memory", "pids")  # the controllers a cage uses
KILL_ROUNDS = 100  # passes over a cage without cgroup.kill before its processes are given up
_pools = itertools.count()  # a process's pools (tests make several), each its own cgroups
REMOVE_EVERY = 0.01  # seconds between tries to remove a cage whose killed processes linger


@dataclass
class Hierarchy:
    """One mounted cgroup hierarchy, at the folder of the server's own cgroup in it."""

    base: Path
    v2: bool
    controllers: set[str] = field(default_factory=set)  # of LIMITED, that this one applies


def hierarchies() -> list[Hierarchy]:
    """The cgroup hierarchies this process can see, at its own cgroup in each."""
    own: dict[str, str] = {}  # controllers ("" for v2) -> the process's cgroup path
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            own[controllers] = path
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields, _, fs = line.partition(" - ")
            root, mount = fields.split()[3:5]
            kind, _, options = fs.split()[:3]
            if kind == "cgroup2" and "" in own:
                base = _folder(mount, root, own[""])
                found.append(Hierarchy(base, True, set(_read(base / "cgroup.controllers")
                                                       .split()) & set(LIMITED)))
            elif kind == "cgroup" and (names := set(options.split(",")) & set(LIMITED)):
                path = next((p for c, p in own.items() if names & set(c.split(","))), None)
                if path is not None:
                    found.append(Hierarchy(_folder(mount, root, path), False, names))
    return found


def _folder(mount: str, root: str, path: str) -> Path:
    """Where cgroup `path` is, in a hierarchy whose `root` is mounted at `mount`."""
    inside = Path(path).relative_to(root) if Path(path).is_relative_to(root) \
        else Path(path.lstrip("/"))
    return Path(mount) / inside


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as out:
        out.write(value)


def _procs(folder: Path) -> list[int]:
    return [int(pid) for pid in _read(folder / "cgroup.procs").split()]


class Containment:
    """This server's cages: made per worker, under one folder per user, in every hierarchy
    it could write (none: process groups)."""

    def __init__(self, worker_memory: int = 0, user_pids: int = 0) -> None:
        for key, value in (("worker_memory", worker_memory), ("user_pids", user_pids)):
            if value < 0:
                raise ConfigError(f"{key} is {value}: a positive limit, or 0 for none", key=key)
        self.worker_memory = worker_memory
        self.user_pids = user_pids
        self.trees: list[Hierarchy] = []  # each at this server's own folder in it
        self._users: set[str] = set()
        self._warden: subprocess.Popen | None = None
        self._leaf: Path | None = None  # where this process moved to delegate v2 controllers
        name = f"llfabric-{_server()}-{next(_pools)}"
        for hierarchy in _chosen(hierarchies()):
            root = hierarchy.base / name
            try:
                root.mkdir(exist_ok=True)
            except OSError as exc:
                log.info("cgroup %s cannot be made (%s)", root, exc)
                continue
            if hierarchy.v2 and hierarchy.controllers:
                try:
                    self._delegate(hierarchy.base, hierarchy.controllers)
                    _enable(root, hierarchy.controllers)
                except OSError as exc:
                    log.info("cgroup %s cannot delegate %s (%s)", hierarchy.base,
                             " ".join(sorted(hierarchy.controllers)), exc)
                    hierarchy.controllers = set()
            self.trees.append(Hierarchy(root, hierarchy.v2, hierarchy.controllers))
        if not self.trees:
            log.warning("no cgroup can be made here: a worker's processes are contained by "
                        "its process group alone, and worker_memory and user_pids are not "
                        "enforced")
            return
        if missing := set(LIMITED) - {c for t in self.trees for c in t.controllers}:
            log.warning("no cgroup %s controller can be used here: %s not enforced",
                        " or ".join(sorted(missing)),
                        " or ".join({"memory": "worker_memory", "pids": "user_pids"}[c]
                                    for c in sorted(missing)))
        swept = [t.base for t in self.trees] + ([self._leaf] if self._leaf else [])
        self._warden = subprocess.Popen(
            [sys.executable, "-m", "fabric.pool.warden", *map(str, swept)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)

    def _delegate(self, base: Path, controllers: set[str]) -> None:
        """Let `base`'s children use `controllers`. A cgroup v2 folder that holds processes
        cannot: this process moves into a leaf of its own there first (the zygotes it starts
        later follow it); OSError if others stay in `base`."""
        try:
            _enable(base, controllers)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            self._leaf = base / f"llfabric-{_server()}-server"
            self._leaf.mkdir(exist_ok=True)
            _write(self._leaf / "cgroup.procs", str(os.getpid()))
            _enable(base, controllers)

    def cage(self, worker: int, user: str = "") -> Cage:
        """A new, empty cage for worker `worker` of `user` ("": the server's own)."""
        folder = f"u-{user or '-'}"
        if user not in self._users:
            for tree in self.trees:
                (tree.base / folder).mkdir(exist_ok=True)
                if tree.v2 and tree.controllers:
                    _enable(tree.base / folder, tree.controllers)
                if "pids" in tree.controllers and self.user_pids:
                    _write(tree.base / folder / "pids.max", str(self.user_pids))
            self._users.add(user)
        dirs = []
        for tree in self.trees:
            path = tree.base / folder / f"w{worker}"
            path.mkdir(exist_ok=True)
            if "memory" in tree.controllers and self.worker_memory:
                _limit_memory(path, tree.v2, self.worker_memory)
            dirs.append((path, tree))
        return Cage(dirs)

    def stop(self) -> None:
        """Kill every cage's processes and remove this server's cgroups."""
        for tree in self.trees:
            sweep(tree.base)
        if self._warden is not None and self._warden.stdin is not None:  # its stdin: a pipe
            self._warden.stdin.close()  # it finds nothing left, and exits
            self._warden.wait()


def _server() -> str:
    """This server, as its cgroups are named (see the module's note)."""
    return f"{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}"


def _chosen(found: list[Hierarchy]) -> list[Hierarchy]:
    """The hierarchies a cage lives in: v2 alone when it applies both limits; else v1's memory
    and pids, with v2 beside them for its cgroup.kill."""
    v2 = next((h for h in found if h.v2), None)
    if v2 is not None and v2.controllers >= set(LIMITED):
        return [v2]
    v1 = [h for h in found if not h.v2 and h.controllers]
    if v2 is not None:
        v2.controllers = set()  # not enabling a part of them: v1 holds those controllers
        return [*v1, v2]
    return v1


def _enable(folder: Path, controllers: set[str]) -> None:
    wanted = set(_read(folder / "cgroup.subtree_control").split())
    if not controllers <= wanted:
        _write(folder / "cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))


def _limit_memory(folder: Path, v2: bool, limit: int) -> None:
    if v2:
        _write(folder / "memory.max", str(limit))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting
            _write(folder / "memory.swap.max", "0")
        return
    _write(folder / "memory.limit_in_bytes", str(limit))
    with contextlib.suppress(OSError):  # swap accounting off: no swap to limit
        _write(folder / "memory.memsw.limit_in_bytes", str(limit))


class Cage:
    """One worker's cgroups (none: its process group)."""

    def __init__(self, dirs: list[tuple[Path, Hierarchy]]) -> None:
        self.dirs = dirs
        # where its processes are killed: v2's folder (cgroup.kill), else any, they hold the same
        self.killed = next((p for p, t in dirs if t.v2), dirs[0][0]) if dirs else None
        self.leader = 0  # without cgroups: the worker, leader of its process group

    def enter(self, *pids: int) -> None:
        """Move `pids` (and their threads) into the cage; the first is the worker's leader."""
        self.leader = self.leader or pids[0]
        for path, _ in self.dirs:
            for pid in pids:
                try:
                    _write(path / "cgroup.procs", str(pid))
                except ProcessLookupError:
                    continue

    def enter_tree(self, root: int) -> None:
        """Move the process tree rooted at `root` into the cage, until no new process shows."""
        moved: set[int] = set()
        while True:
            try:
                tree = {root, *(p.pid for p in psutil.Process(root).children(recursive=True))}
            except psutil.Error:
                return
            if tree <= moved:
                return
            self.enter(root, *sorted(tree - moved - {root}))
            moved |= tree

    def out_of_memory(self) -> bool:
        """Whether the kernel's OOM killer ended a process of the cage (its memory limit)."""
        for path, tree in self.dirs:
            if "memory" in tree.controllers:
                stats = _read(path / ("memory.events" if tree.v2 else "memory.oom_control"))
                for line in stats.splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value) > 0:
                        return True
        return False

    def kill(self) -> None:
        """SIGKILL every process in the cage."""
        if self.killed is None:
            self._kill_group()
        else:
            kill_all(self.killed)

    def _kill_group(self) -> None:
        if not self.leader:
            return
        try:
            found = psutil.Process(self.leader).children(recursive=True)
        except psutil.Error:
            found = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.leader, signal.SIGKILL)
        for process in found:
            with contextlib.suppress(psutil.Error):
                process.kill()

    def remove(self) -> None:
        """Kill what is left and remove the cage."""
        self.kill()
        for path, _ in self.dirs:
            remove(path)


def _tree(folder: Path) -> list[Path]:
    """`folder` and every cgroup below it, parents first; one removed while it is walked
    (a worker's cage going away) is skipped, not an error."""
    return [Path(top) for top, _, _ in os.walk(folder)]


def kill_all(folder: Path) -> None:
    """SIGKILL every process in the cgroup `folder` and its children."""
    if (folder / "cgroup.kill").exists():
        try:
            _write(folder / "cgroup.kill", "1")
        except OSError as exc:  # removed meanwhile: ENODEV once its folder is gone
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise
        return
    for _ in range(KILL_ROUNDS):  # a process may fork between a read and the kills
        pids = [pid for sub in _tree(folder) for pid in _procs(sub)]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def remove(folder: Path) -> None:
    """Remove the cgroup `folder` (and its children) once its killed processes are gone; one
    that will not go is logged and left (a later server's sweep, or the warden, takes it)."""
    for sub in reversed(_tree(folder)):  # children before their parents
        for _ in range(KILL_ROUNDS):
            try:
                sub.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:  # EBUSY: a killed process not yet exited
                if exc.errno != errno.EBUSY:
                    log.warning("cannot remove cgroup %s: %s", sub, exc)
                    break
                kill_all(sub)
                time.sleep(REMOVE_EVERY)
        else:
            log.warning("cgroup %s still holds processes; left", sub)


def sweep(root: Path) -> None:
    """Kill everything under the cgroup `root` and remove it."""
    for sub in _tree(root):
        kill_all(sub)
    remove(root)

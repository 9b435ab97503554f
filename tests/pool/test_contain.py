"""Cages on real processes: a cgroup's kill, and the process-group fallback where no cgroup
can be made."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import wait_until
from namespaces import Namespaces, unavailable

from fabric.pool.contain import Cage, Containment

# a leader whose children stay in its group, leave it (setsid), and leave its tree (orphaned)
SLEEP = f"sleep {uuid.uuid4().int % 10_000 + 6000}"  # told apart from other tests' sleeps
TREE = f"{SLEEP} & setsid {SLEEP} & ({SLEEP} &) ; echo ready; wait"


def _tree(leader: subprocess.Popen) -> list[int]:
    assert leader.stdout.readline() == b"ready\n"
    return [leader.pid, *(p.pid for p in psutil.Process(leader.pid).children(recursive=True))]


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_a_cgroup_cage_kills_its_orphans_too() -> None:
    containment = Containment(user_pids=64)
    if not containment.trees:
        pytest.skip("no cgroup can be made here")
    try:
        cage = containment.cage(1, "someone")
        leader = subprocess.Popen(["sh", "-c", f"read go; {TREE}"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, start_new_session=True)
        cage.enter(leader.pid)  # before it starts anything
        leader.stdin.write(b"go\n")
        leader.stdin.flush()
        pids = _tree(leader)
        orphans: list[int] = []

        def orphaned() -> bool:  # its subshell has forked it, maybe not yet exec'd `sleep`
            orphans[:] = [p.pid for p in psutil.process_iter(["cmdline"])
                          if p.info["cmdline"] == SLEEP.split() and p.pid not in pids]
            return bool(orphans)

        wait_until(orphaned, "the orphaned sleep")
        cage.remove()
        leader.wait()
        assert _gone(pids + orphans)
        assert not any(path.exists() for path, _ in cage.dirs)
    finally:
        containment.stop()
    assert not any(tree.base.exists() for tree in containment.trees)


def test_without_cgroups_a_cage_kills_its_process_group_and_tree() -> None:
    leader = subprocess.Popen(["sh", "-c", TREE], stdout=subprocess.PIPE,
                              start_new_session=True)
    pids = _tree(leader)
    cage = Cage([])
    cage.enter(leader.pid)
    cage.kill()
    leader.wait()
    assert _gone(pids)


# a server's cages in its own PID namespace: says where its worker's cage is, and removes them
# all when told
CAGED = ("import json, sys\n"
         "from fabric.pool.contain import Containment\n"
         "containment = Containment()\n"
         "print(json.dumps([str(path) for path, _ in containment.cage(1).dirs]), flush=True)\n"
         "sys.stdin.readline()\n"
         "containment.stop()\n")


def test_servers_with_one_pid_in_pid_namespaces_of_their_own_keep_their_cages_apart(
        tmp_path: Path) -> None:
    if why := unavailable():
        pytest.skip(why)
    probe = Containment()
    probe.stop()
    if not probe.trees:
        pytest.skip("no cgroup can be made here")
    hosts = [Namespaces(name) for name in ("one", "other")]
    try:
        servers = []
        for host in hosts:
            with host.entered(("pid",)):
                servers.append(subprocess.Popen(
                    host.inside([sys.executable, "-c", CAGED], tmp_path),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE))
        one, other = ([Path(p) for p in json.loads(s.stdout.readline())] for s in servers)
        assert [h.outer_pid(2) for h in hosts] == [s.pid for s in servers]  # both are pid 2
        assert one and not set(one) & set(other)
        servers[0].communicate(b"stop\n", timeout=60)
        assert not any(p.exists() for p in one) and all(p.exists() for p in other)
        servers[1].communicate(b"stop\n", timeout=60)
    finally:
        for host in hosts:
            host.close()

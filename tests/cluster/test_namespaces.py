"""Test hosts in namespaces of their own (`namespaces`): each has its own address on a network
the test made, its own pids, /proc and hostname, and clocks ahead where asked; a cut between
two of them drops their packets and nothing else's, and heals; and once the network is closed,
nothing of it is left: no process, namespace, interface or mount. Without root, they say why
they cannot be made."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from namespaces import Network, no_time_offsets, unavailable

PORT = 7000  # any: each host has its ports to itself
AHEAD = 86400  # seconds a host's clocks run ahead
# says what it sees of its host, then echoes whatever each connection sends
PROBE = ("import json, os, socket, sys, threading, time\n"
         "server = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
         "print(json.dumps({'pid': os.getpid(), 'hostname': socket.gethostname(),\n"
         "    'procs': sum(n.isdigit() for n in os.listdir('/proc')),\n"
         "    'monotonic': time.monotonic(), 'cwd': os.getcwd()}), flush=True)\n"
         "def echo(conn):\n"
         "    while data := conn.recv(100):\n"
         "        conn.sendall(data)\n"
         "while True:\n"
         "    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()\n")

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def test_hosts_are_apart_a_cut_drops_only_their_link_and_nothing_outlives_the_network(
        tmp_path: Path) -> None:
    links, mounts = _links(), Path("/proc/self/mountinfo").read_text()
    ahead = None if no_time_offsets() else AHEAD
    network = Network()
    try:
        a, b = network.host("alpha"), network.host("beta", ahead)
        with b.entered():
            probe = subprocess.Popen(
                b.inside([sys.executable, "-c", PROBE, b.address, str(PORT)], tmp_path),
                stdout=subprocess.PIPE)
        assert probe.stdout is not None
        seen = json.loads(probe.stdout.readline())
        inside = _processes_in({os.stat(ns.path(kind)).st_ino for ns in (network.switch, a, b)
                                for kind in ("net", "pid", "mnt", "uts")})
        assert len(inside) == 7  # each set's unshare and its init, and the probe
        # its own pids (its init is 1), its own /proc, its hostname, the directory it was given
        assert seen["pid"] == 2 and seen["procs"] == 2 and seen["hostname"] == "beta"
        assert seen["cwd"] == str(tmp_path) and b.outer_pid(seen["pid"]) == probe.pid
        if ahead is not None:
            assert seen["monotonic"] - time.monotonic() > ahead - 60
        door = network.connect((b.address, PORT))  # the test process's side of the network
        with a.entered(("net",)):
            peer = socket.create_connection((b.address, PORT), timeout=60)
        assert _echoed(door, b"door") and _echoed(peer, b"peer")

        link = network.cut(a, b)
        link.cut()
        peer.sendall(b"sent while cut")
        with a.entered(("net",)), pytest.raises(TimeoutError):
            socket.create_connection((b.address, PORT), timeout=1)  # it would answer at once
        assert _echoed(door, b"the door's link is up")
        link.heal()
        peer.settimeout(120)  # TCP sends it again: within seconds
        assert peer.recv(100) == b"sent while cut"
        for end in (door, peer):
            end.close()
    finally:
        network.close()
    assert probe.wait(60) is not None
    assert not [pid for pid, started in inside.items() if _started(pid) == started]
    assert _links() == links and Path("/proc/self/mountinfo").read_text() == mounts


def test_without_root_test_hosts_are_not_made_and_it_says_why() -> None:
    support = Path(__file__).parents[1] / "support"
    said = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
         "-c", "import namespaces; print(namespaces.unavailable())"],
        env={"PYTHONPATH": str(support)}, capture_output=True, text=True, check=True)
    assert said.stdout == "namespaced test hosts need root\n"


def _echoed(conn: socket.socket, data: bytes) -> bool:
    conn.settimeout(60)
    conn.sendall(data)
    return conn.recv(100) == data


def _links() -> str:
    """This machine's own network interfaces, as `ip` lists them."""
    return subprocess.run(["ip", "-o", "link"], check=True, capture_output=True,
                          text=True).stdout


def _processes_in(namespaces: set[int]) -> dict[int, str]:
    """The processes in any of `namespaces` (by inode), each with when it started."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            for kind in ("net", "pid", "mnt", "uts"):
                try:
                    if os.stat(entry / "ns" / kind).st_ino in namespaces:
                        found[int(entry.name)] = _started(int(entry.name))
                except OSError:
                    pass
    return found


def _started(pid: int) -> str | None:
    """When process `pid` started (its /proc stat's start time), None if there is none: a
    process, unlike its pid, is never reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None

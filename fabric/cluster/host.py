"""The host actor of one node of a Ray cluster: a detached Ray actor that runs that host's
`llfabric serve` and keeps it running.

The actor itself holds nothing of a session: it starts the node's server as a process of its own
(so user code never runs in a Ray worker), bound to the node's address on TCP, with CURVE keys
the front door's users are admitted by (`admit`); that server owns the host's zygotes, workers,
leases and store, exactly as a single host's does. The process dies with the actor (the kernel's
parent-death signal), and Ray restarts an actor that dies; a server that exits on its own is
started again on the same port by the next `start`.

Its slots: the node's GPUs, else its `llfabric_slots` resource (CPU slots standing in for GPUs),
else the server's own default (one per core).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TypedDict

from ..auth import Keys
from ..client import listening
from ..errors import FabricError
from ..private import log_tail, private_dir
from ..snapshot.tiers import write_atomic
from .peers import PEER, write_peers

log = logging.getLogger(__name__)

SLOTS = "llfabric_slots"  # a node's CPU slots, where it has no GPUs
START_TIMEOUT = 300.0  # seconds a live host's server may take to listen (its first zygote imports)

# A child that dies with the process that started it: set before the server's own code runs.
_LAUNCH = ("import ctypes, os, signal, sys\n"
           "ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"  # PR_SET_PDEATHSIG
           # its starter died first (0: a starter alive outside its PID namespace)
           "if os.getppid() not in (0, int(sys.argv[1])): sys.exit(1)\n"
           "from cli.main import main\n"
           "sys.argv = ['llfabric', 'serve']\n"
           "main()\n")


class HostInfo(TypedDict):
    """A started host, as the front door joins it: its server (`address`, `server_key`, the
    cells it can run at once), its blobs' socket (`peer_*`) and its metrics' address."""

    name: str
    node: str
    address: str
    server_key: str
    slots: int
    pid: int
    peer_address: str
    peer_key: str
    metrics: str


class HostActor:
    """One node's host: `start` it, `admit` the front door's users, `stop` it."""

    def __init__(self, node: str, root: str, settings: dict[str, str], slots: int) -> None:
        """`settings`: the configuration every host's server takes from the front door
        (`LLFABRIC_*` variables: its remote tier, the copies of each commit)."""
        self.node = node
        self.name = host_name(node)
        self.root = Path(root) / "hosts" / self.name
        self.settings, self.slots = settings, slots
        self.keys = Keys(private_dir(self.root / "keys"))
        self.peer_keys = Keys(private_dir(self.keys.root / "peers"))  # its blobs' socket
        self.port = self.peer_port = self.metrics_port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def ip(self) -> str:
        """The address its server binds, and is reached at: its node's."""
        return _node_ip()

    @property
    def address(self) -> str:
        return f"tcp://{self.ip}:{self.port}"

    def start(self, users: dict[str, str], key: bytes, peer: tuple[str, str]) -> HostInfo:
        """Admit `users` (name -> public key) and the cluster's `peer` key pair, start the
        server unless it runs, its store signing with the cluster's `key`; what the front door
        needs to reach it, and its peers to read its blobs."""
        for user, public in users.items():
            self.admit(user, public)
        _admit(self.peer_keys, PEER, peer[0])
        self.share([], peer)
        self._use_key(key)
        process = self.process
        if process is None or process.poll() is not None:
            process = self._spawn()
        public, _ = self.keys.server_pair()
        peer_public, _ = self.peer_keys.server_pair()
        return {"name": self.name, "node": self.node, "address": self.address,
                "server_key": public, "slots": self.slots, "pid": process.pid,
                "peer_address": self.peer_address, "peer_key": peer_public,
                "metrics": self.metrics}

    def admit(self, user: str, public: str) -> None:
        """Admit the front door's key for `user`: it connects as them."""
        _admit(self.keys, user, public)

    def share(self, peers: list[dict], pair: tuple[str, str]) -> None:
        """The other hosts whose blobs this one reads before the remote tier's."""
        write_peers(self.root / "peers.json", pair, peers)

    @property
    def metrics(self) -> str:
        return f"{self.ip}:{self.metrics_port}"

    @property
    def peer_address(self) -> str:
        return f"tcp://{self.ip}:{self.peer_port}"

    def _use_key(self, key: bytes) -> None:
        """Sign with the cluster's key: a manifest one host commits, the next one reads."""
        path = private_dir(self.root / "store") / "key"
        if not path.exists():
            write_atomic(path, key)
        elif path.read_bytes() != key:
            raise FabricError(f"the store of host {self.name} ({path.parent}) signs with "
                              "another key than this cluster's: it served another cluster; "
                              "move it away to join this one", host=self.name)

    def _command(self) -> list[str]:
        """The server's command line."""
        return [sys.executable, "-c", _LAUNCH, str(os.getpid())]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _spawn(self) -> subprocess.Popen[bytes]:
        """The server's process, started and listening."""
        self.port = self.port or _free_port(self.ip)
        self.peer_port = self.peer_port or _free_port(self.ip)
        self.metrics_port = self.metrics_port or _free_port(self.ip)
        # a cluster's host does not linger unless told to: a move of a session whose worker
        # lingered raced the worker's park, and the dump found it killed
        env = {"LLFABRIC_LINGER": "0", **os.environ, **self.settings,
               "LLFABRIC_STORE": str(self.root / "store"),
               "LLFABRIC_RUNTIME_DIR": str(self.root / "run"),
               "LLFABRIC_KEY_DIR": str(self.keys.root),
               "LLFABRIC_BIND": self.address,
               "LLFABRIC_PEER_BIND": self.peer_address,
               "LLFABRIC_PEERS": str(self.root / "peers.json"),
               "LLFABRIC_METRICS_BIND": self.metrics}
        if self.slots:
            env["LLFABRIC_SLOTS"] = str(self.slots)
        # what Ray showed the actor of the GPUs is not the server's to obey: it leases the
        # node's GPUs (NVML's) to cells itself
        env.pop("CUDA_VISIBLE_DEVICES", None)
        log_file = open(self.root / "serve.log", "ab")  # noqa: SIM115 - the child holds it
        with log_file:
            self.process = subprocess.Popen(
                self._command(), env=env,
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while not listening(self.address):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise FabricError(f"the llfabric server of host {self.name} did not start: "
                                  f"{log_tail(self.root / 'serve.log')}", host=self.name)
            time.sleep(0.1)
        return self.process


def host_name(node: str) -> str:
    """A node's host, as status lists it and `drain` takes it: its id's ends (ids Ray makes in
    a test cluster differ in their last digits alone)."""
    return node[:6] + node[-6:]


def _admit(keys: Keys, user: str, public: str) -> None:
    write_atomic(private_dir(keys.authorized) / f"{user}.pub", public.encode() + b"\n")


def node_slots(resources: dict[str, float]) -> int:
    """The slots a node's resources give its host; 0: the server's default."""
    return int(resources.get("GPU", 0)) or int(resources.get(SLOTS, 0))


def held_slots(resources: dict[str, float]) -> dict[str, float]:
    """The custom resources a node's actor holds for its host: its declared slots, where its
    slots are not GPUs (those it holds as Ray's own `num_gpus`)."""
    return {} if resources.get("GPU") or not resources.get(SLOTS) else {SLOTS: resources[SLOTS]}


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _free_port(ip: str) -> int:
    with socket.socket() as probe:
        probe.bind((ip, 0))
        return probe.getsockname()[1]

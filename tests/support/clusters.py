"""Clusters of this machine's processes for the many-hosts tests: a Ray cluster (a head and, by
default, two nodes, each with one CPU slot standing in for a GPU, and small object stores), or
the front door over hosts started without Ray, each behind a link a test cuts (`LocalCluster`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from cuts import Relay
from helpers import wait_until

from fabric.client import Client

NODE = {"num_cpus": 1, "resources": {"llfabric_slots": 1}, "object_store_memory": 80 << 20}


@contextlib.contextmanager
def told_raylets() -> Iterator[None]:
    """Nodes started in this process meanwhile start a raylet told every agent port (see
    `raylets/told_raylets.py`)."""
    import told_raylets

    told_raylets.tell()
    try:
        yield
    finally:
        told_raylets.untell()


@contextlib.contextmanager
def ray_cluster(env: dict[str, str] | None = None,
                nodes: tuple[dict[str, str], ...] = ({}, {}), head_gpus: int = 0
                ) -> Iterator[object]:
    """The cluster, for the block; `env`: the environment its node processes start in (the
    hosts' servers and their workers inherit it), default this process's; `nodes`: what each
    node besides the head adds to it; `head_gpus`: GPUs the head declares to Ray (none real:
    its server leases CPU slots)."""
    from ray.cluster_utils import Cluster

    with told_raylets():
        saved = dict(os.environ)
        try:
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            base = dict(os.environ)
            cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_gpus": head_gpus})
            for extra in nodes:
                os.environ.update(extra)
                cluster.add_node(**NODE)
                os.environ.clear()
                os.environ.update(base)
            cluster.wait_for_nodes()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        try:
            yield cluster
        finally:
            cluster.shutdown()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(address: str) -> dict[str, float]:
    """Prometheus samples at `address` (HOST:PORT), by name and labels."""
    body = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return {sample.rsplit(" ", 1)[0]: float(sample.rsplit(" ", 1)[1])
            for sample in body.splitlines() if sample and not sample.startswith("#")}


def host_of(client: Client, session: str) -> str | None:
    """The host the front door has the session on; None while no host lists it (between two
    hosts, as it moves)."""
    return next((s.host for s in client.status().sessions if s.session == session), None)


class LocalMembers:
    """A cluster's nodes as the front door asks for them (`fabric.cluster.members.Members`),
    without Ray: a host actor per node (`HostActor`, the very object Ray would run there),
    called in this process, and each host's server, and its blobs' socket that the other hosts
    read, reached through a `Relay` a test cuts. The first node is the head."""

    def __init__(self, root: str, settings: dict[str, str], nodes: int) -> None:
        from fabric.cluster.host import HostActor, host_name

        self.actors = {node: HostActor(node, root, settings, 1)
                       for node in (uuid.uuid4().hex for _ in range(nodes))}
        self.names = {host_name(node): node for node in self.actors}
        self.relays: dict[str, Relay] = {}  # by node
        self.peer_relays: dict[str, Relay] = {}  # by node: to its blobs' socket
        self.started = dict.fromkeys(self.actors, 0)  # the door's starts of each node's host

    def nodes(self) -> dict[str, dict]:
        from fabric.cluster.host import SLOTS
        from fabric.cluster.scaling import HEAD

        return {node: {"CPU": 1.0, SLOTS: 1.0, **({HEAD: 1.0} if i == 0 else {})}
                for i, node in enumerate(self.actors)}

    def start(self, node: str, resources: dict, users: dict[str, str], key: bytes,
              peer: tuple[str, str]) -> dict:
        info = self.actors[node].start(users, key, peer)
        self.started[node] += 1
        return {**info, "address": _relayed(self.relays, node, info["address"]),
                "peer_address": _relayed(self.peer_relays, node, info["peer_address"])}

    def admit(self, node: str, user: str, public: str) -> None:
        self.actors[node].admit(user, public)

    def share(self, node: str, peers: list[dict], pair: tuple[str, str]) -> None:
        self.actors[node].share(peers, pair)

    def stop(self, node: str) -> None:
        self.actors[node].stop()

    def request(self, bundles: list[dict]) -> None:
        """No autoscaler: the nodes are what they are."""

    def close(self) -> None:
        for actor in self.actors.values():
            actor.stop()
        for relay in (*self.relays.values(), *self.peer_relays.values()):
            relay.close()


def _relayed(relays: dict[str, Relay], node: str, address: str) -> str:
    """Where `node`'s `address` is reached through its relay in `relays`."""
    relay = relays.get(node)
    if relay is None or relay.target != address:
        relay = relays[node] = Relay(address)
    return relay.address


class LocalCluster:
    """The front door (`fabric.cluster.door.Door`, in a thread of this process) over `nodes`
    hosts on this machine (`LocalMembers`), with a remote tier in `root` (or at `remote`)."""

    def __init__(self, root: Path, nodes: int, remote: str | None = None) -> None:
        from fabric.cluster.door import Door
        from fabric.config import Config

        self.remote = remote or f"file://{root}/remote"
        self.sockets = Path(tempfile.mkdtemp(prefix="llf-door-"))
        self.config = Config(store=root / "door", runtime_dir=self.sockets,
                             bind=f"ipc://{self.sockets}/door.sock", remote=self.remote)
        self.members = LocalMembers(str(self.config.store), {
            "LLFABRIC_REMOTE": self.remote, "LLFABRIC_COPIES": str(self.config.copies)}, nodes)
        self.door = Door(self.config, self.members)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._serve, name="door")

    def _serve(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await self.door.serve()

        asyncio.run(serve())

    def __enter__(self) -> LocalCluster:
        self._thread.start()
        with self.client() as client:
            wait_until(lambda: client.ping(timeout=1) and
                     len([h for h in client.status().hosts if h.alive]) == len(
                         self.members.actors), "every host up", 300)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.door.stop)
        self._thread.join(120)
        shutil.rmtree(self.sockets, ignore_errors=True)

    def client(self, timeout: float = 120) -> Client:
        return Client(self.config.address, timeout=timeout)

    def relay(self, host: str) -> Relay:
        return self.members.relays[self.members.names[host]]

    def cut(self, host: str) -> None:
        """`host` partitioned off: from the door and from the other hosts' reads of its blobs."""
        node = self.members.names[host]
        for relay in (self.members.relays[node], self.members.peer_relays[node]):
            relay.cut()

    def heal(self, host: str) -> None:
        node = self.members.names[host]
        for relay in (self.members.relays[node], self.members.peer_relays[node]):
            relay.heal()

    def starts(self, host: str) -> int:
        """How many times the door started `host` (or found it running and took it)."""
        return self.members.started[self.members.names[host]]

    def pid(self, host: str) -> int:
        process = self.members.actors[self.members.names[host]].process
        assert process is not None
        return process.pid

    def store(self, host: str) -> Path:
        return self.config.store / "hosts" / host / "store"

    def sessions_on(self, host: str) -> set[str]:
        """The sessions open on `host`, as its own server lists them: asked directly (not
        through its relay), as the door's owner, with the key the door reaches it with."""
        from fabric.auth import ClientKey

        actor = self.members.actors[self.members.names[host]]
        owner = self.door.owner
        key = ClientKey(owner, *self.door.keys[owner], actor.keys.server_pair()[0])
        with Client(actor.address, timeout=30, key=key) as client:
            return {s.session for s in client.status().sessions}

"""Clusters of this machine for the many-hosts tests: a Ray cluster (a head and, by default, two
nodes, each with one CPU slot standing in for a GPU, and small object stores), or the front door
over hosts started without Ray, each behind a link a test cuts (`LocalCluster`); their hosts in
namespaces of their own (`namespaces`) where the machine allows it, else processes of it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from cuts import Relay
from helpers import RunningServer, serving, wait_until
from namespaces import Cut, Host, Network, no_time_offsets, unavailable

from fabric.client import Client
from fabric.cluster.host import HostActor, host_name
from fabric.private import private_dir

log = logging.getLogger(__name__)

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
                ) -> Iterator[RayCluster]:
    """The cluster, for the block; `env`: the environment its node processes start in (the
    hosts' servers and their workers inherit it), default this process's; `nodes`: what each
    node besides the head adds to it; `head_gpus`: GPUs the head declares to Ray (none real:
    its server leases CPU slots). Each node runs on a test host of its own where this machine
    allows it (`namespaces`), else as processes of this machine, and a warning says why."""
    if why := unavailable():
        log.warning("the Ray cluster's nodes run as processes of this machine: %s", why)
        cluster: RayCluster = PlainRay(env, nodes, head_gpus)
    else:
        cluster = NamespacedRay(env, [*NODE_FLAGS, f"--num-gpus={head_gpus}",
                                      "--include-dashboard=false"],
                                [(extra, NODE_FLAGS) for extra in nodes])
    try:
        yield cluster
    finally:
        cluster.shutdown()


class RayCluster:
    """A Ray cluster of this machine: its head's GCS `address`, its nodes (each with its
    `node_id`), and what reaches them. The front door runs where a driver of the cluster
    does (`serving`), and so do the test's own reads of it (`scrape`, `resources`)."""

    address: str
    head_node: object
    network: Network | None = None

    def list_all_nodes(self) -> list:
        raise NotImplementedError

    def remove_node(self, node: object) -> None:
        """The node gone, its processes killed."""
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError

    def on_network(self) -> contextlib.AbstractContextManager[None]:
        """The calling thread where a driver of the cluster runs: the sockets it makes, and the
        processes it starts, reach every node there."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def serving(self, store: Path, env: dict[str, str] | None = None,
                **settings: object) -> Iterator[RunningServer]:
        """The front door over the cluster (`helpers.serving` with `ray` set), started where a
        driver runs; its own socket is ipc://, which this process reaches from anywhere."""
        with contextlib.ExitStack() as stack:
            with self.on_network():
                running = stack.enter_context(serving(store, env, ray=self.address, **settings))
            yield running

    def scrape(self, address: str) -> dict[str, float]:
        """Prometheus samples at `address` (HOST:PORT) as a driver reaches it: the door's, a
        host's server's."""
        with self.on_network():
            return scrape(address)

    def resources(self) -> tuple[dict[str, float], dict[str, float]]:
        """The cluster's resources and those available now, as another Ray job sees them."""
        program = ("import json, ray, sys\n"
                   "ray.init(address=sys.argv[1], namespace='a-ray-user', "
                   "logging_level='WARNING', log_to_driver=False)\n"
                   "print(json.dumps([ray.cluster_resources(), ray.available_resources()]))\n")
        with self.on_network():
            done = subprocess.run([sys.executable, "-c", program, self.address],
                                  capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        total, available = json.loads(done.stdout.strip().splitlines()[-1])
        return total, available


class PlainRay(RayCluster):
    """Ray's own test cluster (`ray.cluster_utils.Cluster`): its nodes' processes started by
    this process, as processes of this machine."""

    def __init__(self, env: dict[str, str] | None, nodes: tuple[dict[str, str], ...],
                 head_gpus: int) -> None:
        from ray.cluster_utils import Cluster

        with told_raylets():
            saved = dict(os.environ)
            try:
                if env is not None:
                    os.environ.clear()
                    os.environ.update(env)
                base = dict(os.environ)
                self.cluster = Cluster(initialize_head=True,
                                       head_node_args={**NODE, "num_gpus": head_gpus})
                for extra in nodes:
                    os.environ.update(extra)
                    self.cluster.add_node(**NODE)
                    os.environ.clear()
                    os.environ.update(base)
                self.cluster.wait_for_nodes()
            finally:
                os.environ.clear()
                os.environ.update(saved)
        self.address = self.cluster.address
        self.head_node = self.cluster.head_node

    def list_all_nodes(self) -> list:
        return self.cluster.list_all_nodes()

    def remove_node(self, node: object) -> None:
        self.cluster.remove_node(node)

    def shutdown(self) -> None:
        self.cluster.shutdown()


@dataclasses.dataclass(frozen=True)
class HostNode:
    """A Ray node on a test host of its own: its id, and the host."""

    node_id: str
    host: Host


PATIENT = {"RAY_NUM_REDIS_GET_RETRIES": "150"}  # a node's start waits 5 minutes for the head
# `ray start`'s flags for a test cluster's node (`NODE`)
NODE_FLAGS = [f"--num-cpus={NODE['num_cpus']}", f"--resources={json.dumps(NODE['resources'])}",
              f"--object-store-memory={NODE['object_store_memory']}"]


class NamespacedRay(RayCluster):
    """A Ray cluster whose every node, the head too, runs on a test host of its own on a
    network this makes (`namespaces.Network`): `ray start` there, bound to the host's address,
    so its raylet, its agents, its workers and the host actors they run (and the servers those
    start) have the host's network, pids, /proc and hostname. A driver runs on the head's
    network (Ray connects a driver to a raylet at its own address), the front door too.

    `env`: the environment its node processes start in (default this process's); `head`: the
    head's flags for `ray start` and what it adds to `env`; `nodes`: one node each, started with
    the head, with what it adds to `env` and its flags; `autoscaled`: the head's autoscaler, with
    the provider `told_raylets.Provider`, adds and removes nodes, each on a test host too."""

    GCS_PORT = 6379  # any: each host has its ports to itself

    def __init__(self, env: dict[str, str] | None, head: list[str],
                 nodes: Sequence[tuple[dict[str, str], list[str]]] = (),
                 head_env: dict[str, str] | None = None, autoscaled: bool = False) -> None:
        self.network = Network()
        self.temp = Path(tempfile.mkdtemp(prefix="llf-ray-"))  # short: it holds sockets
        self.env = dict(os.environ if env is None else env)
        self.nodes: list[HostNode] = []
        self._hosts = threading.Lock()  # a network makes one host at a time
        self._listener: socket.socket | None = None
        self._server: threading.Thread | None = None
        try:
            head_env = {**self.env, **(head_env or {})}
            if autoscaled:
                from told_raylets import NODES

                head_env[NODES] = self._serve_nodes()
            self.head_node = self._node()
            self.address = f"{self.head_node.host.address}:{self.GCS_PORT}"
            added = [self._node() for _ in nodes]  # by this thread: see `Namespaces`
            with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as starts:
                for started in [starts.submit(self._start, self.head_node, head_env, [
                        "--head", f"--port={self.GCS_PORT}", *head])] + [
                        starts.submit(self._join, node, extra, flags)
                        for node, (extra, flags) in zip(added, nodes, strict=True)]:
                    started.result()
        except BaseException:
            self.shutdown()
            raise

    def add_node(self, node: str, extra: dict[str, str], flags: list[str]) -> HostNode:
        """Node `node` (its id) started on a new test host, with what it adds to the cluster's
        environment and its flags for `ray start`; it returns once the node has joined."""
        added = self._node(node)
        self._join(added, extra, flags)
        return added

    def _node(self, node: str | None = None) -> HostNode:
        """A new host, for node `node` (default a new id)."""
        import ray

        node = node or ray.NodeID.from_random().hex()
        with self._hosts:
            self.nodes.append(HostNode(node, self.network.host(host_name(node))))
            return self.nodes[-1]

    def _join(self, node: HostNode, extra: dict[str, str], flags: list[str]) -> None:
        # it waits for the head's GCS, asking every 2 s
        self._start(node, {**self.env, **extra, **PATIENT}, [
            f"--address={self.address}", "--include-log-monitor=false", *flags])

    def _start(self, node: HostNode, env: dict[str, str], args: list[str]) -> None:
        """`ray start` on the node's host, its raylet told every agent port (`told_raylets`),
        its files (sockets, logs) in a folder of its own; it returns once the node has joined
        the cluster."""
        command = [sys.executable, str(Path(__file__).with_name("raylets") / "told_raylets.py"),
                   "start", *args, f"--node-ip-address={node.host.address}",
                   f"--temp-dir={private_dir(self.temp / node.host.name)}",
                   "--disable-usage-stats"]
        log_path = self.temp / f"{node.host.name}.log"
        work = private_dir(self.temp / node.host.name / "work")
        with open(log_path, "ab") as out, node.host.entered():
            # its processes outlive it (their pid 1 is the host's init): their output goes to
            # Ray's logs, and theirs to a file, never to a pipe left open
            done = subprocess.run(node.host.inside(command, work),
                                  env={**env, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": node.node_id},
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"ray start on {node.host.name} failed:\n"
                               f"{log_path.read_text(errors='replace')[-6000:]}")

    def list_all_nodes(self) -> list[HostNode]:
        return [node for node in self.nodes if not node.host.closed]

    def remove_node(self, node: object) -> None:
        """Its raylet stopped, as Ray's own test cluster stops it (the cluster hears of it at
        once: its workers, the host actor and its server among them, end with it), then its
        host killed, with every process left there."""
        assert isinstance(node, HostNode)
        raylets = [pid for pid, line in node.host.commands().items()
                   if line.split(" ", 1)[0].endswith("/raylet/raylet")]
        for pid in raylets:
            with contextlib.suppress(ProcessLookupError):
                _ended(pid, signal.SIGTERM)
        node.host.close()

    def node(self, node: str) -> HostNode:
        """The node whose id is `node`."""
        return next(n for n in self.nodes if n.node_id == node)

    def host(self, node: str) -> Host:
        """The test host of the node whose id is `node`."""
        return self.node(node).host

    def _serve_nodes(self) -> str:
        """A socket (its path) where Ray's autoscaler, through its node provider
        (`told_raylets.Provider`), asks for each node it adds or removes, until `shutdown`: each
        on a test host of its own (`add_node`, `remove_node`). A request is a line of JSON,
        `{"add": NODE, "env": {...}, "flags": [...]}` or `{"remove": NODE}`; its answer a line
        of JSON too, `{"error": null}` or what failed."""
        path = self.temp / "nodes.sock"
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(path))
        self._listener.listen()
        # it makes the hosts it adds, and outlives them (see `Namespaces`)
        self._server = threading.Thread(target=self._answer, args=(self._listener,),
                                        daemon=True, name="nodes")
        self._server.start()
        return str(path)

    def _answer(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # shut down
                return
            with connection, connection.makefile("rw") as lines:
                request = json.loads(lines.readline())
                try:
                    if "add" in request:
                        self.add_node(request["add"], request["env"], request["flags"])
                    else:
                        self.remove_node(self.node(request["remove"]))
                    lines.write(json.dumps({"error": None}) + "\n")
                except Exception as exc:  # the provider raises it in the autoscaler
                    lines.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")

    def on_network(self) -> contextlib.AbstractContextManager[None]:
        return self.head_node.host.entered(("net",))

    def shutdown(self) -> None:
        if self._listener is not None:
            self._listener.shutdown(socket.SHUT_RDWR)  # its thread's `accept` fails
            assert self._server is not None
            self._server.join(60)
            self._listener.close()
        if self.network is not None:
            self.network.close()
        shutil.rmtree(self.temp, ignore_errors=True)


def _ended(pid: int, how: signal.Signals, timeout: float = 30) -> None:
    """Process `pid` sent `how` and waited for (killed past `timeout`); not a child of
    this one."""
    ending = os.pidfd_open(pid)
    try:
        signal.pidfd_send_signal(ending, how)
        if not select.select([ending], [], [], timeout)[0]:
            signal.pidfd_send_signal(ending, signal.SIGKILL)
            select.select([ending], [], [], timeout)
    finally:
        os.close(ending)


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
    read, reached through a `Relay` a test cuts. The first node is the head. On a `network`,
    each host runs in namespaces of its own there (`NamespacedHostActor`), its clocks `ahead` as
    that says (by node, in order): its relay reaches it across that network, and the other hosts
    reach its blobs' socket directly (`LocalCluster.peer_link` cuts them apart)."""

    def __init__(self, root: str, settings: dict[str, str], nodes: int,
                 network: Network | None = None, ahead: Sequence[int | None] = ()) -> None:
        self.network = network
        self.actors = {node: self._actor(node, root, settings, clock)
                       for node, clock in itertools.zip_longest(
                           (uuid.uuid4().hex for _ in range(nodes)), ahead[:nodes])}
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
        if self.network is not None:
            return {**info, "address": _relayed(self.relays, node, info["address"],
                                                self.network.connect)}
        return {**info, "address": _relayed(self.relays, node, info["address"]),
                "peer_address": _relayed(self.peer_relays, node, info["peer_address"])}

    def _actor(self, node: str, root: str, settings: dict[str, str],
               ahead: int | None) -> HostActor:
        if self.network is None:
            return HostActor(node, root, settings, 1)
        name = host_name(node)
        temp = private_dir(Path(root) / "hosts" / name / "tmp")  # its own runtime folders
        return NamespacedHostActor(node, root, {**settings, "TMPDIR": str(temp)}, 1,
                                   self.network.host(name, ahead))

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


class NamespacedHostActor(HostActor):
    """A host actor whose server runs in a test host's namespaces (`namespaces.Host`): bound
    to its address there, with its own pids, /proc, hostname (and clocks), and working
    directory."""

    def __init__(self, node: str, root: str, settings: dict[str, str], slots: int,
                 host: Host) -> None:
        super().__init__(node, root, settings, slots)
        self.host = host

    @property
    def ip(self) -> str:
        return self.host.address

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.host.entered():  # its ports probed, its server started, and seen listening
            return super()._spawn()

    def _command(self) -> list[str]:
        return self.host.inside(super()._command(), private_dir(self.root / "work"))


def _relayed(relays: dict[str, Relay], node: str, address: str,
             dial: Callable[[tuple[str, int]], socket.socket] = socket.create_connection) -> str:
    """Where `node`'s `address` is reached through its relay in `relays` (`dial`: see `Relay`)."""
    relay = relays.get(node)
    if relay is None or relay.target != address:
        relay = relays[node] = Relay(address, dial)
    return relay.address


class LocalCluster:
    """The front door (`fabric.cluster.door.Door`, in a thread of this process) over `nodes`
    hosts on this machine (`LocalMembers`), with a remote tier in `root` (or at `remote`);
    `namespaced`: each host in namespaces of its own on a network the cluster makes
    (`namespaces.Network`), where this machine allows it (else plain processes, and a warning
    that says why), the clocks of each `ahead` of this machine's by as many seconds (where the
    kernel has time namespaces)."""

    def __init__(self, root: Path, nodes: int, remote: str | None = None,
                 namespaced: bool = False, ahead: Sequence[int | None] = ()) -> None:
        from fabric.cluster.door import Door
        from fabric.config import Config

        self.network: Network | None = None
        if namespaced and (why := unavailable()):
            log.warning("the cluster's hosts run as processes of this machine: %s", why)
        elif namespaced:
            self.network = Network()
        if any(ahead) and self.network is not None and (why := no_time_offsets()):
            log.warning("the cluster's hosts keep this machine's clocks: %s", why)
            ahead = ()

        self.remote = remote or f"file://{root}/remote"
        self.sockets = Path(tempfile.mkdtemp(prefix="llf-door-"))
        self.config = Config(store=root / "door", runtime_dir=self.sockets,
                             bind=f"ipc://{self.sockets}/door.sock", remote=self.remote)
        self.members = LocalMembers(str(self.config.store), {
            "LLFABRIC_REMOTE": self.remote, "LLFABRIC_COPIES": str(self.config.copies)}, nodes,
            self.network, ahead)
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
        try:
            with self.client() as client:
                wait_until(lambda: client.ping(timeout=1) and
                         len([h for h in client.status().hosts if h.alive]) == len(
                             self.members.actors), "every host up", 300)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.door.stop)
        self._thread.join(120)
        if self.network is not None:
            self.network.close()
        shutil.rmtree(self.sockets, ignore_errors=True)

    def client(self, timeout: float = 120) -> Client:
        return Client(self.config.address, timeout=timeout)

    def relay(self, host: str) -> Relay:
        return self.members.relays[self.members.names[host]]

    def door_link(self, host: str) -> Relay | Cut:
        """What cuts the door off from `host`, and heals: its relay, or on namespaced hosts
        their network, between the door's side of it and the host."""
        if self.network is None:
            return self.relay(host)
        return self.network.cut(self.network.switch, self._namespaces(host))

    def peer_link(self, a: str, b: str) -> Cut:
        """What cuts hosts `a` and `b` off from each other (reads of each other's blobs), and
        heals: their network, on namespaced hosts only."""
        if self.network is None:
            raise ValueError("only namespaced hosts have links between them to cut")
        return self.network.cut(self._namespaces(a), self._namespaces(b))

    def _namespaces(self, host: str) -> Host:
        actor = self.members.actors[self.members.names[host]]
        assert isinstance(actor, NamespacedHostActor)
        return actor.host

    def outer_pid(self, host: str, pid: int) -> int | None:
        """The pid in this process's PID namespace of `host`'s process `pid` (as its server
        reports it); None if it has none."""
        return pid if self.network is None else self._namespaces(host).outer_pid(pid)
    def cut(self, host: str) -> None:
        """`host` partitioned off: from the door and from the other hosts' reads of its blobs."""
        for link in self._links(host):
            link.cut()

    def heal(self, host: str) -> None:
        for link in self._links(host):
            link.heal()

    def _links(self, host: str) -> list[Relay | Cut]:
        """`host`'s link to the door, and the other hosts' to its blobs."""
        if self.network is None:
            node = self.members.names[host]
            return [self.members.relays[node], self.members.peer_relays[node]]
        return [self.door_link(host), *(self.peer_link(host, other)
                                        for other in self.members.names if other != host)]

    def starts(self, host: str) -> int:
        """How many times the door started `host` (or found it running and took it)."""
        return self.members.started[self.members.names[host]]

    def pid(self, host: str) -> int:
        """The pid of `host`'s server, in this process's PID namespace."""
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
        with self._on_network():
            client = Client(actor.address, timeout=30, key=key)
        with client:
            return {s.session for s in client.status().sessions}

    def _on_network(self) -> contextlib.AbstractContextManager[None]:
        """The calling thread where it reaches the hosts directly (its ZeroMQ sockets, and
        their I/O threads, are made there)."""
        if self.network is None:
            return contextlib.nullcontext()
        return self.network.switch.entered(("net",))

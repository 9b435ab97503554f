"""Many hosts on a real Ray cluster of this machine: a head and two nodes, each with one CPU slot
standing in for a GPU, each on a test host of its own where the machine allows it (else as
processes of this machine), and the front door over them (`llfabric serve --ray`).

One cluster serves the module; the test that removes a node runs last."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import clusters
import pytest
from clusters import NamespacedRay, RayCluster, host_of
from helpers import RunningServer, execute, session_status, text, wait_until
from namespaces import SUBNET, unavailable

from cli.status import describe
from fabric.client import Client
from fabric.cluster.host import host_name
from fabric.errors import RemoteError
from fabric.messages import Moved
from fabric.status import HostStatus, SessionStatus

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    with clusters.ray_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def door(ray_cluster: RayCluster, door_metrics: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("cluster")
    with ray_cluster.serving(root / "door", remote=f"file://{root}/remote",
                             metrics_bind=door_metrics) as running:
        with running.client() as client:
            wait_until(lambda: len(client.status().hosts) == 3, "three hosts")
        yield running


@pytest.fixture
def client(door: RunningServer) -> Iterator[Client]:
    with door.client(timeout=120) as c:
        yield c


def opened(client: Client, name: str, cwd: Path) -> SessionStatus:
    return client.open(name, str(cwd))


def hosts(client: Client) -> dict[str, HostStatus]:
    return {h.name: h for h in client.status().hosts}


def test_a_cell_runs_on_a_host_and_its_reply_says_which_and_why(
        ray_cluster: RayCluster, client: Client, door_metrics: str, tmp_path: Path) -> None:
    first = opened(client, "where", tmp_path)
    assert first.placement.reason == "least-loaded"
    reply, outputs = execute(client, "where", "x = 41\nprint(x + 1)")
    assert text(outputs) == "42\n"
    assert reply["host"] == first.host and reply["placement"]["reason"] == "kept"
    status = client.status()
    cluster = {h.name: h for h in status.hosts}
    assert len(cluster) == 3 and all(h.alive for h in cluster.values())
    assert cluster[reply["host"]].sessions >= 1
    assert host_of(client, "where") == reply["host"]
    assert status.leases.slots == 3
    shown = "\n".join(describe(status))  # `llfabric status`
    assert f"session where on host {reply['host']}: version 1" in shown
    assert all(f"host {name} (" in shown for name in cluster)
    samples = ray_cluster.scrape(door_metrics)
    assert samples['llfabric_hosts{state="up"}'] == 3
    assert samples['llfabric_placements_total{reason="kept"}'] >= 1
    host_metrics = ray_cluster.scrape(cluster[reply["host"]].metrics)  # its own server's
    assert host_metrics['llfabric_cells_total{path="cold",status="ok"}'] >= 1


def test_a_session_opens_again_on_the_host_that_holds_its_state(client: Client,
                                                               tmp_path: Path) -> None:
    first = opened(client, "near", tmp_path)
    execute(client, "near", "blob = bytes(range(256)) * 8192")  # 2 MiB on that host's disk
    client.call("close", session="near")
    for other in ("fill-1", "fill-2"):  # the hosts with fewer sessions are the others now
        opened(client, other, tmp_path)
    again = opened(client, "near", tmp_path)
    assert again.host == first.host
    assert again.placement.reason == "locality"
    assert again.placement.held >= 2 << 20


def test_drain_moves_a_session_with_its_state_to_another_host(
        ray_cluster: RayCluster, client: Client, door_metrics: str, tmp_path: Path) -> None:
    opened(client, "moving", tmp_path)
    # a generator cannot be saved: the host the session moves to rebuilds it from its lineage
    first, _ = execute(client, "moving", "import math\nvalues = [math.sqrt(i) for i in "
                       "range(5)]\nsquare = lambda v: v * v\nsquares = (v * v for v in range(3))")
    before = host_of(client, "moving")
    reply = client.call("drain", host=before)
    assert Moved("moving", host_of(client, "moving")) in reply.moved
    after = host_of(client, "moving")
    assert after != before
    result, outputs = execute(client, "moving",
                              "print(round(sum(map(square, values))), list(squares))")
    assert text(outputs) == "10 [0, 1, 4]\n" and result["host"] == after
    leased = first["timings"]["lease_held"] + result["timings"]["lease_held"]
    status = session_status(client, "moving")
    assert status.lease_seconds >= leased * 0.99  # its lease on the host it left counts
    sourced = hosts(client)[after].sourced  # the state came from the host it left
    assert sourced.get("peer", 0) > 0 and not sourced.get("remote")
    fetched = ray_cluster.scrape(hosts(client)[after].metrics)
    assert fetched['llfabric_state_fetched_bytes_total{tier="peer"}'] == sourced["peer"]
    assert fetched['llfabric_state_fetch_seconds_total{tier="peer"}'] > 0
    assert ray_cluster.scrape(door_metrics)["llfabric_session_moves_total"] >= 1
    elsewhere = {opened(client, f"elsewhere-{i}", tmp_path).host for i in range(3)}
    client.call("drain", host=before, undo=True)
    assert before not in elsewhere  # a drained host takes no new session


def test_drain_moves_a_pinned_worker_with_its_unsaveable_value(
        ray_cluster: RayCluster, client: Client, door_metrics: str, tmp_path: Path) -> None:
    opened(client, "pinned", tmp_path)
    # a generator cannot be saved, and a cell that makes a folder is never run again: only the
    # worker itself can carry `numbers` to the next host
    execute(client, "pinned", f"import os\nos.makedirs({str(tmp_path / 'made')!r}, "
            "exist_ok=True)\nnumbers = (i * i for i in range(10))\nfirst = next(numbers)")
    before = host_of(client, "pinned")
    client.call("drain", host=before)
    after = host_of(client, "pinned")
    assert after != before
    waiting = session_status(client, "pinned")
    assert waiting.tier == "cool" and waiting.pinned and waiting.memory > 0
    result, outputs = execute(client, "pinned", "print(first, next(numbers), next(numbers))")
    assert text(outputs) == "0 1 4\n" and result["host"] == after
    # restored, not forked anew (in a PID namespace of its own: not under the pid it had)
    assert (result["source"], result["start"]) == ("cool", "restored")
    carried = ray_cluster.scrape(door_metrics)
    assert carried['llfabric_workers_carried_total{outcome="arrived"}'] >= 1
    client.call("drain", host=before, undo=True)
    with pytest.raises(RemoteError) as err:
        client.call("drain", host="no-such-host")
    assert err.value.kind == "unknown_host"


def test_each_host_runs_on_a_test_host_of_its_own(ray_cluster: RayCluster,
                                                 client: Client) -> None:
    """As root, every node is on a test host (`namespaces`): its host's server listens at that
    host's address on the test's network, and runs in that host's PID namespace."""
    if not isinstance(ray_cluster, NamespacedRay):
        pytest.skip(f"the nodes are processes of this machine: {unavailable()}")
    ours = os.stat("/proc/self/ns/pid").st_ino
    for status in hosts(client).values():
        host = ray_cluster.host(status.node)
        assert host.address.startswith(f"{SUBNET}.")
        assert status.address.startswith(f"tcp://{host.address}:")
        servers = [pid for pid, line in host.commands().items() if "from cli.main import" in line]
        assert servers, host.commands()
        assert {os.stat(f"/proc/{pid}/ns/pid").st_ino for pid in servers} == {
            os.stat(host.path("pid")).st_ino} != {ours}


def test_a_host_lost_mid_cell_loses_no_commit_and_the_session_runs_on(
        ray_cluster: RayCluster, client: Client, door: RunningServer, tmp_path: Path) -> None:
    head = host_name(ray_cluster.head_node.node_id)
    client.call("drain", host=head)  # the cluster lives on its head: the session opens elsewhere
    opened(client, "survivor", tmp_path)
    client.call("drain", host=head, undo=True)
    execute(client, "survivor", "kept = 'committed'")
    host = host_of(client, "survivor")
    node = next(n for n in ray_cluster.list_all_nodes() if host_name(n.node_id) == host)
    before = {name: h.sourced.get("remote", 0) for name, h in hosts(client).items()}
    result: dict = {}

    def long_cell() -> None:
        with door.client(timeout=120) as own:
            try:
                execute(own, "survivor", "import time\nkept = 'never'\ntime.sleep(60)")
            except RemoteError as exc:
                result["error"] = exc

    runner = threading.Thread(target=long_cell)
    runner.start()
    wait_until(lambda: any(s.running for s in client.status().sessions
                           if s.session == "survivor"), "the long cell runs")
    started = time.monotonic()
    ray_cluster.remove_node(node)
    runner.join(60)
    assert not runner.is_alive(), "the lost host's cell never ended"
    error = result["error"]
    assert error.kind == "host_lost" and error.fields["version"] == 1, error.message
    assert time.monotonic() - started < 30
    reply, outputs = execute(client, "survivor", "print(kept)")
    assert text(outputs) == "committed\n"
    assert reply["host"] != host and reply["version"] == 1  # the reading cell made none
    assert not hosts(client)[host].alive
    # the lost host alone had the state on its disk: it came from the remote
    assert hosts(client)[reply["host"]].sourced.get("remote", 0) > before[reply["host"]]

"""A cluster without a remote tier: each commit is kept on `copies` hosts (2 by default) before
its cell is reported done, so a node removed mid-session loses no commit, and the session's next
cell, on another host, finds the newest version its peers hold."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import clusters
import pytest
from clusters import RayCluster, host_of
from helpers import execute, text, wait_until

from fabric.client import Client
from fabric.cluster.host import host_name

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    with clusters.ray_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(ray_cluster: RayCluster,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    with ray_cluster.serving(tmp_path_factory.mktemp("copies") / "door") as running, \
            running.client(timeout=120) as client:
        wait_until(lambda: len(client.status().hosts) == 3, "three hosts")
        yield client


def test_a_node_removed_loses_no_commit_without_a_remote(ray_cluster: RayCluster,
                                                        client: Client, tmp_path: Path) -> None:
    head = host_name(ray_cluster.head_node.node_id)
    client.call("drain", host=head)  # the cluster lives on its head: the session opens elsewhere
    client.call("open", session="kept", cwd=str(tmp_path))
    client.call("drain", host=head, undo=True)
    execute(client, "kept", "import numpy as np\nfirst = np.arange(100_000)")
    reply, _ = execute(client, "kept", "second = first * 2")
    assert not [n for n in reply.get("notices", []) if n["topic"] == "copies"]
    host = host_of(client, "kept")
    node = next(n for n in ray_cluster.list_all_nodes() if host_name(n.node_id) == host)
    ray_cluster.remove_node(node)  # the only copy left is on one of the two other hosts
    wait_until(lambda: not next(h for h in client.status().hosts
                                if h.name == host).alive, "the door sees the host lost")
    reply, outputs = execute(client, "kept", "print(int(second.sum()), len(first))")
    assert text(outputs) == f"{2 * sum(range(100_000))} 100000\n"
    # no commit lost: the session goes on from the last one (version 2), the reading cell making
    # a version of its own or not
    assert reply["host"] != host and reply["version"] >= 2

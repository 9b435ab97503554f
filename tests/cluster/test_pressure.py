"""On a Ray cluster of a head that declares a GPU and one node whose server always finds memory
short (its threshold set to 1%): the front door moves the session whose worker holds the most
memory off that node, the worker with it; and what each host leases (the head's GPU, the node's
slot) is its host's alone in Ray's books."""

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
    with clusters.ray_cluster(nodes=({"LLFABRIC_MEMORY_PRESSURE": "1"},),
                              head_gpus=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(ray_cluster: RayCluster, door_metrics: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    root = tmp_path_factory.mktemp("pressed")
    with ray_cluster.serving(root / "door", remote=f"file://{root}/remote",
                             metrics_bind=door_metrics) as running, \
            running.client(timeout=120) as client:
        wait_until(lambda: len(client.status().hosts) == 2, "two hosts")
        yield client


def test_a_host_short_of_memory_moves_its_session_off_with_its_worker(
        ray_cluster: RayCluster, client: Client, door_metrics: str, tmp_path: Path) -> None:
    head = host_name(ray_cluster.head_node.node_id)
    client.call("drain", host=head)  # the session opens on the node short of memory
    client.call("open", session="pressed", cwd=str(tmp_path))
    # only its worker holds `numbers` (a generator, made by a cell that is never run again)
    execute(client, "pressed", f"import os\nos.makedirs({str(tmp_path / 'made')!r}, "
            "exist_ok=True)\nnumbers = (i * i for i in range(10))\nfirst = next(numbers)")
    pressed = host_of(client, "pressed")
    assert pressed != head
    client.call("drain", host=head, undo=True)  # now there is a host to move it to
    wait_until(lambda: host_of(client, "pressed") == head, "the session moves to the head",
               timeout=60)
    result, outputs = execute(client, "pressed", "print(first, next(numbers))")
    assert text(outputs) == "0 1\n" and result["host"] == head
    # a new session opens on the head, though the host short of memory has none
    assert client.call("open", session="fresh", cwd=str(tmp_path)).host == head
    samples = ray_cluster.scrape(door_metrics)
    assert samples["llfabric_sessions_relieved_total"] >= 1
    assert samples['llfabric_workers_carried_total{outcome="arrived"}'] >= 1


def test_what_a_host_leases_is_held_in_rays_books(ray_cluster: RayCluster,
                                                  client: Client) -> None:
    head = host_name(ray_cluster.head_node.node_id)
    assert next(h for h in client.status().hosts if h.name == head).slots == 1
    # another Ray job finds the GPU taken, though no cell runs on it now
    total, available = ray_cluster.resources()
    assert total.get("GPU") == 1 and available.get("GPU", 0) == 0
    # and the other node's slot (its slots are no GPUs), so its autoscaler keeps the node; the
    # head's slots are its GPU, and its declared slot stays free
    assert total.get("llfabric_slots") == 2 and available.get("llfabric_slots", 0) == 1

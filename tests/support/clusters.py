"""A Ray cluster of this machine's processes for the many-hosts tests: a head and (by default)
two nodes, each with one CPU slot standing in for a GPU, and small object stores."""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.request
from collections.abc import Iterator

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

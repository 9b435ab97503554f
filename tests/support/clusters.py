"""A Ray cluster of this machine's processes for the many-hosts tests: a head and two nodes,
each with one CPU slot standing in for a GPU, and small object stores."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

NODE = {"num_cpus": 1, "resources": {"llfabric_slots": 1}, "object_store_memory": 80 << 20}


@contextlib.contextmanager
def ray_cluster(env: dict[str, str] | None = None) -> Iterator[object]:
    """The cluster, for the block; `env`: the environment its node processes start in (the
    hosts' servers and their workers inherit it), default this process's."""
    from ray.cluster_utils import Cluster

    saved = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        cluster = Cluster(initialize_head=True, head_node_args=NODE)
        for _ in range(2):
            cluster.add_node(**NODE)
        cluster.wait_for_nodes()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield cluster
    finally:
        cluster.shutdown()

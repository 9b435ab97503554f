"""Raylets told every agent port, for test clusters on a loaded machine.

A raylet waits a fixed 15 s for each agent port it was not given (its agents choose and write
them down), and aborts when a loaded machine's slow Python start overruns that; Ray never gives
a raylet its dashboard agent's listen port, nor the autoscaler's nodes any. `tell()` makes the
raylets this process starts a stand-in (`raylet_stand_in`) that chooses every such port and
tells the raylet, its agents and its workers. This folder holds these two modules alone: Ray's
own processes (the `ray start` that starts a head, the autoscaler that starts nodes) import
them by PYTHONPATH. The autoscaler's provider (`Provider`) asks the test for each node instead,
where the test puts each on a test host of its own.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from ray._private import services
from ray._private.ray_constants import LABELS_ENVIRONMENT_VARIABLE, RESOURCES_ENVIRONMENT_VARIABLE
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_WORKER,
    STATUS_UP_TO_DATE,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_NAME,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

STAND_IN = '#!/bin/sh\nexec "{python}" "{program}" "{real}" "$@"\n'
REAL = services.RAYLET_EXECUTABLE
NODES = "LLFABRIC_TEST_NODES"  # where the test serves the autoscaler's nodes, if it does


def tell() -> None:
    """Raylets this process starts from now on are told every agent port."""
    if services.RAYLET_EXECUTABLE != REAL:
        return
    folder = tempfile.mkdtemp(prefix="llf-raylet-")
    atexit.register(shutil.rmtree, folder, True)
    stand_in = Path(folder) / "raylet"
    program = Path(__file__).with_name("raylet_stand_in.py")
    stand_in.write_text(STAND_IN.format(python=sys.executable, program=program, real=REAL))
    stand_in.chmod(0o755)
    services.RAYLET_EXECUTABLE = str(stand_in)


def untell() -> None:
    services.RAYLET_EXECUTABLE = REAL


class Provider(FakeMultiNodeProvider):
    """Ray's fake multi-node provider, its nodes' raylets told (the autoscaler imports it).
    Where the test serves nodes (a socket at `$LLFABRIC_TEST_NODES`: see
    `clusters.NamespacedRay.serving_nodes`), it asks there for each node it adds, each on a
    test host of its own, and for each it removes; else it starts them in this process."""

    def __init__(self, provider_config: dict, cluster_name: str) -> None:
        tell()
        super().__init__(provider_config, cluster_name)
        self.served = os.environ.get(NODES)

    def _create_node_with_resources_and_labels(self, node_config: dict, tags: dict, count: int,
                                               resources: dict, labels: dict) -> None:
        if not self.served:
            return super()._create_node_with_resources_and_labels(
                node_config, tags, count, resources, labels)
        resources = dict(resources)
        with self.lock:  # what the fake provider gives its nodes, as `ray start` takes it
            node_type = tags[TAG_RAY_USER_NODE_TYPE]
            node = self._next_hex_node_id()
            flags = [f"--num-cpus={resources.pop('CPU', 0)}",
                     f"--num-gpus={resources.pop('GPU', 0)}"]
            if memory := resources.pop("object_store_memory", None):
                flags.append(f"--object-store-memory={memory}")
            _ask(self.served, {"add": node, "flags": flags, "env": {
                "RAY_CLOUD_INSTANCE_ID": node, "RAY_NODE_TYPE_NAME": node_type,
                RESOURCES_ENVIRONMENT_VARIABLE: json.dumps(resources),
                LABELS_ENVIRONMENT_VARIABLE: json.dumps(labels)}})
            self._nodes[node] = {"tags": {
                TAG_RAY_NODE_KIND: NODE_KIND_WORKER, TAG_RAY_USER_NODE_TYPE: node_type,
                TAG_RAY_NODE_NAME: node, TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE, **tags}}

    def _terminate_node(self, node: dict) -> None:
        if not self.served:
            return super()._terminate_node(node)
        _ask(self.served, {"remove": node["tags"][TAG_RAY_NODE_NAME]})


def _ask(path: str, request: dict) -> None:
    """What the test serving nodes at `path` does as `request` asks; its failure raised."""
    with socket.socket(socket.AF_UNIX) as connection:
        connection.connect(path)
        with connection.makefile("rw") as lines:
            lines.write(json.dumps(request) + "\n")
            lines.flush()
            if error := json.loads(lines.readline())["error"]:
                raise RuntimeError(f"the test's node service failed: {error}")


if __name__ == "__main__":  # `ray`'s command line, its raylets told: `python told_raylets.py start`
    from ray.scripts.scripts import main

    tell()
    sys.argv[0] = "ray"
    main()

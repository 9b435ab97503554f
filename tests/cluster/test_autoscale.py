"""Autoscaling, on Ray's fake multi-node autoscaler: a cell that waits for a lease makes the
cluster ask for a node, runs on it once its host joins, and the host, idle again, is released
and its node taken back.

As root, the head and each node the autoscaler adds run on test hosts of their own
(`clusters.NamespacedRay`: the provider asks the test for each node). Elsewhere the fake
autoscaler's cluster is started with `ray start`, after `ray stop --force`, and the autoscaler
starts its nodes as processes of this machine: this module must not share the machine with
another Ray cluster."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusters import NamespacedRay
from helpers import RunningServer, execute_in_thread, serving, text, wait_until
from namespaces import SUBNET, unavailable

from fabric.client import Client
from fabric.messages import Executed, Output, Queued
from fabric.status import HostStatus

ray_utils = pytest.importorskip("ray.cluster_utils")
told_raylets = pytest.importorskip("told_raylets")
log = logging.getLogger(__name__)
# the type the fake provider tags its head node with: a configuration naming the head otherwise
# makes the autoscaler launch (and remove) a node of that type on every pass
HEAD = pytest.importorskip("ray.autoscaler._private.fake_multi_node.node_provider"
                           ).FAKE_HEAD_NODE_TYPE

WORKER = {"resources": {"CPU": 1, "llfabric_slots": 1}, "node_config": {},
          "min_workers": 0, "max_workers": 1}


class FakeAutoscaling(ray_utils.AutoscalingCluster):
    """Ray's fake multi-node autoscaler, its configuration written here in full: Ray's wheel
    leaves out the file the base class reads it from. Its raylets, the head's and the nodes' the
    autoscaler starts, are told every agent port (`told_raylets`)."""

    def _generate_config(self, head_resources: dict, worker_node_types: dict,
                         autoscaler_v2: bool = False, **settings: object) -> dict:
        return {
            "cluster_name": "llfabric-autoscale", "max_workers": 2, "head_node_type": HEAD,
            "provider": {"type": "external", "module": "told_raylets.Provider",
                         "use_node_id_as_ip": True,
                         "disable_node_updaters": True, "disable_launch_config_check": True},
            "available_node_types": {
                **worker_node_types,
                HEAD: {"resources": dict(head_resources), "node_config": {}, "max_workers": 0}},
            "auth": {}, "docker": {}, "upscaling_speed": 1.0, "file_mounts": {},
            "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
            "worker_setup_commands": [], "head_start_ray_commands": [],
            "worker_start_ray_commands": [], "cluster_synced_files": [],
            "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
            **settings}

    def start(self, override_env: dict[str, str] | None = None) -> None:
        subprocess.check_call(["ray", "stop", "--force"])
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as config:
            json.dump(self._config, config)
        resources = dict(self._head_resources)
        subprocess.check_call(
            [sys.executable, told_raylets.__file__, "start", "--head",
             f"--autoscaling-config={config.name}",
             f"--num-cpus={resources.pop('CPU')}",
             f"--object-store-memory={resources.pop('object_store_memory')}"],
            env={**os.environ, **PROVIDER, **(override_env or {})})


# the autoscaler's pace, and where it finds the provider
PROVIDER = {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1",
            "PYTHONPATH": os.pathsep.join([str(Path(told_raylets.__file__).parent),
                                           os.environ.get("PYTHONPATH", "")])}
# one slot on the head: by the servers' own setting (Ray's custom resources on a `ray start`
# command line are what the base class cannot pass)
HEAD_ENV = {"LLFABRIC_SLOTS": "1"}


@pytest.fixture(scope="module")
def autoscaling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    cluster = FakeAutoscaling(
        head_resources={"CPU": 1, "object_store_memory": 80 << 20},
        # a node is taken back once idle for a minute: long enough for its host actor to be
        # placed (from then on it holds the node's slot, and the node is busy until the door
        # releases the host) while a loaded machine starts the actor's Ray worker; 15 s was not
        worker_node_types={"slot": WORKER}, idle_timeout_minutes=1.0)
    bin_dir = str(Path(sys.executable).parent)  # where `ray` is, which the cluster runs
    if bin_dir not in os.environ["PATH"].split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ["PATH"]
    root = tmp_path_factory.mktemp("autoscale")
    settings = {"remote": f"file://{root}/remote", "idle_release": 3}
    if why := unavailable():
        log.warning("the autoscaled cluster's nodes run as processes of this machine: %s", why)
        cluster.start(override_env=HEAD_ENV)
        try:
            with serving(root / "door", ray="auto", **settings) as running:
                yield running
        finally:
            cluster.shutdown()
        return
    config = root / "autoscaling.json"
    config.write_text(json.dumps(cluster._config))
    resources = dict(cluster._head_resources)
    # the head, and each node its autoscaler adds, on a test host of its own
    namespaced = NamespacedRay(None, [
        f"--autoscaling-config={config}", f"--num-cpus={resources.pop('CPU')}",
        f"--object-store-memory={resources.pop('object_store_memory')}"],
        head_env={**HEAD_ENV, **PROVIDER}, autoscaled=True)
    try:
        with namespaced.serving(root / "door", **settings) as running:
            yield running
    finally:
        namespaced.shutdown()


def hosts(client: Client) -> list[HostStatus]:
    return [h for h in client.status().hosts if h.alive]


def test_a_waiting_cell_brings_a_node_and_an_idle_host_gives_it_back(
        autoscaling: RunningServer, tmp_path: Path) -> None:
    with autoscaling.client(timeout=120) as client:
        wait_until(lambda: len(hosts(client)) == 1, "the head's host alive")  # the head alone
        for name in ("busy", "waiting"):
            client.call("open", session=name, cwd=str(tmp_path))
        head = hosts(client)[0].name
        # the head's slot stays held until the waiting cell has run on the new node, however
        # long the node takes to come up
        go = tmp_path / "go"
        holder, _ = execute_in_thread(
            autoscaling, "busy", f"import os, time\nwhile not os.path.exists({str(go)!r}):\n"
                                 "    time.sleep(0.05)")
        wait_until(lambda: any(h.running for h in hosts(client)), "the head's slot held")
        events = list(client.execute("waiting", "print('ran')", timeout=180))
        reply = events[-1]
        assert isinstance(reply, Executed)
        assert any(isinstance(e, Queued) for e in events)  # it waited for the new node
        assert text([e.output for e in events if isinstance(e, Output)]) == "ran\n"
        assert reply.host != head and len(hosts(client)) == 2
        if unavailable() is None:  # each host, the added one too, on a test host of its own
            ips = {h.address.removeprefix("tcp://").rsplit(":", 1)[0] for h in hosts(client)}
            assert len(ips) == 2 and all(ip.startswith(f"{SUBNET}.") for ip in ips), ips
        go.touch()
        holder.join(60)
        client.call("close", session="waiting")
        # released by the door, then its node taken back by the autoscaler
        wait_until(lambda: len(client.status().hosts) == 1, "the node given back",
                   timeout=300)

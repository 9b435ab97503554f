"""A Ray cluster's nodes, and the host actor on each (`fabric.cluster.host`): the front door's
`Members`.

Every call here blocks (Ray's client is synchronous): the front door makes them in a thread.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError, FabricError
from .host import HostActor, HostInfo, held_slots, node_slots

if TYPE_CHECKING:
    from ray import ObjectRef

log = logging.getLogger(__name__)

NAMESPACE = "llfabric"
CALL_TIMEOUT = 180.0  # seconds a host actor may take to start its server


class Members(Protocol):
    """A cluster's nodes and the host on each, as its front door asks for them (blocking)."""

    def nodes(self) -> dict[str, dict]: ...
    def start(self, node: str, resources: dict, users: dict[str, str], key: bytes,
              peer: tuple[str, str]) -> HostInfo: ...
    def admit(self, node: str, user: str, public: str) -> None: ...
    def share(self, node: str, peers: list[dict], pair: tuple[str, str]) -> None: ...
    def stop(self, node: str) -> None: ...
    def request(self, bundles: list[dict]) -> None: ...
    def close(self) -> None: ...


class RayMembers:
    def __init__(self, address: str, root: str, settings: dict[str, str]) -> None:
        try:
            import ray
            import ray.exceptions
        except ImportError as exc:
            raise ConfigError("serving on a Ray cluster needs Ray: pip install "
                              "'llfabric[ray]'", key="ray") from exc
        self.ray = ray
        if os.environ.get("RAY_AUTH_MODE") != "token":
            log.warning("Ray's token authentication is off (RAY_AUTH_MODE): whoever reaches "
                        "the cluster's ports can run code on it and read the keys the door "
                        "gives its hosts")
        self.root, self.settings = root, settings  # see `HostActor`
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING,
                 log_to_driver=False, ignore_reinit_error=True)
        self._actor = ray.remote(HostActor)

    def nodes(self) -> dict[str, dict]:
        """Alive nodes by id, with their resources."""
        return {n["NodeID"]: n["Resources"] for n in self.ray.nodes() if n["Alive"]}

    def start(self, node: str, resources: dict, users: dict[str, str], key: bytes,
              peer: tuple[str, str]) -> HostInfo:
        """The host actor of `node`, started (or found) and its server running: its info. It
        holds what its server leases to cells (the node's GPUs, else its declared slots) in
        Ray's books: Ray schedules nothing else on them, and its autoscaler takes back no node
        whose host is up (the door releases idle hosts itself)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = self._actor.options(
            name=f"llfabric-host-{node}", lifetime="detached", get_if_exists=True,
            num_cpus=0, num_gpus=resources.get("GPU", 0), resources=held_slots(resources),
            max_restarts=-1, max_task_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote(node, self.root, self.settings, node_slots(resources))
        return self._get(actor.start.remote(users, key, peer))

    def admit(self, node: str, user: str, public: str) -> None:
        self._get(self._actor_of(node).admit.remote(user, public))

    def share(self, node: str, peers: list[dict], pair: tuple[str, str]) -> None:
        self._get(self._actor_of(node).share.remote(peers, pair))

    def stop(self, node: str) -> None:
        """Stop the node's server and its actor (`llfabric drain` then release)."""
        actor = self._actor_of(node)
        self._get(actor.stop.remote())
        self.ray.kill(actor, no_restart=True)

    def _actor_of(self, node: str):
        return self.ray.get_actor(f"llfabric-host-{node}", namespace=NAMESPACE)

    def _get(self, ref: ObjectRef[Any]) -> Any:
        """What a host actor's call returned (Ray's handles do not say its type)."""
        try:
            return self.ray.get(ref, timeout=CALL_TIMEOUT)
        except self.ray.exceptions.RayError as exc:
            raise FabricError(f"a host actor failed: {exc}") from exc

    def request(self, bundles: list[dict]) -> None:
        """Ask Ray's autoscaler for nodes with these resources (none: release the ask)."""
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=bundles)

    def close(self) -> None:
        self.ray.shutdown()

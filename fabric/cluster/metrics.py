"""What operators watch of a cluster's front door, as Prometheus metrics (each host's server
serves its own, `fabric.metrics`, at the address `llfabric status` lists for it).

Counted as they happen: cells' wait in the cluster's queue, placements by reason, sessions
moved between hosts, hosts lost, connections refused. Read when scraped: hosts by state, the
slots and running cells of each, and the sessions open on each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..metrics import DELAYS


class DoorMetrics:
    """`live` returns the hosts as `status` lists them."""

    def __init__(self, live: Callable[[], list[dict]]) -> None:
        self.registry = CollectorRegistry()
        self.queue_wait = Histogram(
            "llfabric_cluster_queue_wait_seconds", "Time a cell waited in the cluster's queue "
            "for a host with a free lease", buckets=DELAYS, registry=self.registry)
        self.placements = Counter(
            "llfabric_placements", "Where cells and sessions went, by the policy's reason "
            "(kept, locality, least-loaded, random)", ["reason"], registry=self.registry)
        self.moves = Counter("llfabric_session_moves", "Sessions moved between hosts",
                             registry=self.registry)
        self.relieved = Counter(
            "llfabric_sessions_relieved", "Sessions moved off hosts short of memory",
            registry=self.registry)
        self.carried = Counter(
            "llfabric_workers_carried", "Pinned workers carried to another host as CRIU "
            "images, by outcome (arrived, refused)", ["outcome"], registry=self.registry)
        self.hosts_lost = Counter("llfabric_hosts_lost", "Hosts lost while they served "
                                  "sessions, or released idle", ["why"],
                                  registry=self.registry)
        self.auth_failures = Counter(
            "llfabric_auth_failures", "Connections refused: unknown, revoked or no keys",
            registry=self.registry)
        self.registry.register(_Hosts(live))


class _Hosts(Collector):
    def __init__(self, live: Callable[[], list[dict]]) -> None:
        self.live = live

    def collect(self) -> Iterator[GaugeMetricFamily]:
        hosts = self.live()
        states = GaugeMetricFamily("llfabric_hosts", "Hosts, by state (up, draining, lost)",
                                   labels=["state"])
        counts = {"up": 0, "draining": 0, "lost": 0}
        for host in hosts:
            counts["lost" if not host["alive"] else
                   "draining" if host["draining"] else "up"] += 1
        for state, count in counts.items():
            states.add_metric([state], count)
        yield states
        for name, what in (("slots", "Lease slots"), ("running", "Cells running or waiting "
                           "for a lease"), ("sessions", "Sessions open")):
            family = GaugeMetricFamily(f"llfabric_host_{name}", f"{what}, by host",
                                       labels=["host"])
            for host in hosts:
                if host["alive"]:
                    family.add_metric([host["name"]], host[name])
            yield family

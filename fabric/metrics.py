"""What operators watch, as Prometheus metrics of one server (prometheus-client), served over
HTTP at `metrics_bind` when it is set.

Counted as cells end: how long each waited before its code ran (visible delay, and the part of
it spent queued for a lease), how its worker was readied (a draft ready before execute, a warm or
pinned worker, a cold start, with a load when the draft missed) and from which source, what
readying took, commits, and failures by exception. Read when scraped: leases held and queued,
sessions by tier and the memory each holds, workers and zygotes, host memory (in use, stalls,
pressure, what kept workers hold, those made to leave), and the bytes of state fetched from
peers and the remote tier or copied to it. Refused connections are counted by `fabric.auth`. A
cluster's front door has its own (`fabric.cluster.metrics`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .errors import ConfigError
from .messages import Executed

# Seconds: the visible delay's goal (100 ms) sits on a bucket edge.
DELAYS = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    """One server's metrics. `live` returns what is read at each scrape: `leases` (the
    leases' status), `sessions` (each session's status), `memory` (the keeper's status), and
    the counts of `workers` and `zygotes`."""

    def __init__(self, live: Callable[[], dict]) -> None:
        self.registry = CollectorRegistry()
        self.visible_delay = Histogram(
            "llfabric_cell_visible_delay_seconds", "From execute received to the cell's code "
            "running", buckets=DELAYS, registry=self.registry)
        self.queue_wait = Histogram(
            "llfabric_cell_queue_wait_seconds", "Time a cell waited for its lease",
            buckets=DELAYS, registry=self.registry)
        self.prepare = Histogram(
            "llfabric_worker_prepare_seconds", "Readying a cell's worker (fork or restore, and "
            "its state load), by worker source", ["source"], buckets=DELAYS,
            registry=self.registry)
        self.cells = Counter(
            "llfabric_cells", "Cells run, by how their worker was readied (draft, warm, pinned, "
            "cold; +load when the draft missed state) and how they ended", ["path", "status"],
            registry=self.registry)
        self.drafts = Counter(
            "llfabric_drafts", "Cells whose worker a draft or a kept worker had ready (hit), "
            "ready but short of state (load), or not at all (miss)", ["outcome"],
            registry=self.registry)
        self.failures = Counter(
            "llfabric_cell_failures", "Cells that ended in an exception, by its name",
            ["reason"], registry=self.registry)
        self.commits = Counter("llfabric_commits", "Versions committed",
                               registry=self.registry)
        self.auth_failures = Counter(
            "llfabric_auth_failures", "Connections refused: unknown, revoked or no keys",
            registry=self.registry)
        self.registry.register(_Live(live))

    def cell(self, reply: Executed) -> None:
        """Count one cell, from the reply its session sent."""
        path, status, timings = reply.path, reply.status, reply.timings
        self.visible_delay.observe(timings["visible_delay"])
        self.queue_wait.observe(timings["queue"])
        self.prepare.labels(reply.source).observe(timings["prepare"])
        self.cells.labels(path, status).inc()
        ready = not path.startswith("cold")
        self.drafts.labels("miss" if not ready else "load" if "+load" in path else "hit").inc()
        if status == "error":
            self.failures.labels(reply.ename or "unknown").inc()
        self.commits.inc()

    def serve(self, bind: str) -> WSGIServer:
        return serve(self.registry, bind)


def serve(registry: CollectorRegistry, bind: str) -> WSGIServer:
    """Serve `registry` at /metrics on `bind` (HOST:PORT) in a thread of this process, until
    the returned server is shut down."""
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"metrics_bind must be HOST:PORT, not {bind!r}")
    try:
        httpd, _ = start_http_server(int(port), addr=host.strip("[]"), registry=registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {bind}: {exc}") from exc
    return httpd


class _Live(Collector):
    """Gauges read from the server at each scrape, so they are never stale."""

    def __init__(self, live: Callable[[], dict]) -> None:
        self.live = live

    def collect(self) -> Iterator[Metric]:
        now = self.live()
        leases = now["leases"]
        yield GaugeMetricFamily("llfabric_lease_slots", "Execution slots (GPUs, else CPU "
                                "slots)", value=leases["slots"])
        yield GaugeMetricFamily("llfabric_leases_held", "Slots leased to running cells "
                                "and to workers lingering after theirs",
                                value=leases["held"])
        yield GaugeMetricFamily("llfabric_leases_queued", "Cells waiting for a lease",
                                value=leases["queued"])
        tiers = GaugeMetricFamily("llfabric_sessions", "Open sessions, by where their state is "
                                  "(hot: running a cell; warm: a worker kept; cool: on disk; "
                                  "cold: the store alone) and whether a worker is pinned",
                                  labels=["tier", "pinned"])
        counts: dict[tuple[str, str], int] = {}
        for session in now["sessions"]:
            key = (str(session["tier"]), str(bool(session["pinned"])).lower())
            counts[key] = counts.get(key, 0) + 1
        for (tier, pinned), count in sorted(counts.items()):
            tiers.add_metric([tier, pinned], count)
        yield tiers
        yield from _memory(now["sessions"], now["memory"])
        yield GaugeMetricFamily("llfabric_workers", "Worker processes alive",
                                value=now["workers"])
        yield GaugeMetricFamily("llfabric_zygotes", "Zygotes alive", value=now["zygotes"])
        fetched = CounterMetricFamily("llfabric_state_fetched_bytes", "State this host lacked, "
                                      "fetched before a load, by the tier it came from "
                                      "(peer, remote)", labels=["tier"])
        for tier, nbytes in sorted(now["sourced"].items()):
            fetched.add_metric([tier], nbytes)
        yield fetched
        seconds = CounterMetricFamily("llfabric_state_fetch_seconds", "Seconds spent fetching "
                                      "state this host lacked, by the tier it came from",
                                      labels=["tier"])
        for tier, spent in sorted(now["sourced_seconds"].items()):
            seconds.add_metric([tier], spent)
        yield seconds
        yield CounterMetricFamily("llfabric_replicated_bytes", "Saved state copied to the "
                                  "remote tier before its commit", value=now["replicated"])
        if (backlog := now.get("backlog")) is not None:  # a remote filled behind
            yield GaugeMetricFamily("llfabric_remote_backlog_versions", "Committed versions "
                                    "the remote tier filled behind still lacks",
                                    value=backlog["versions"])
            yield GaugeMetricFamily("llfabric_remote_backlog_sessions", "Sessions whose head "
                                    "the remote tier filled behind still lacks",
                                    value=backlog["sessions"])
            yield GaugeMetricFamily("llfabric_remote_failing", "1 while the remote tier filled "
                                    "behind fails (its backlog is retried)",
                                    value=1 if backlog["failing"] else 0)
            yield CounterMetricFamily("llfabric_remote_sent_bytes", "State sent to the remote "
                                      "tier filled behind", value=backlog["sent_bytes"])


def _memory(sessions: list[dict], memory: dict) -> Iterator[Metric]:
    """Each session's memory, and the host's as its keeper reads it."""
    held = GaugeMetricFamily("llfabric_session_memory_bytes", "Memory each open session holds "
                             "now, by tier: its worker's processes' PSS (hot, warm), or its "
                             "image on disk (cool)", labels=["session", "tier"])
    for session in sessions:
        if session["memory"]:
            held.add_metric([str(session["session"]), str(session["tier"])], session["memory"])
    yield held
    yield GaugeMetricFamily("llfabric_memory_used_percent", "Memory in use, percent of the "
                            "host's or of its cgroup's limit", value=memory["used_percent"])
    if memory["stall_percent"] is not None:
        yield GaugeMetricFamily("llfabric_memory_stall_percent", "Percent of the last 10 s "
                                "some task stalled waiting for memory (PSI)",
                                value=memory["stall_percent"])
    yield GaugeMetricFamily("llfabric_memory_pressure", "1 while memory is short (kept "
                            "workers leave), else 0", value=int(memory["pressure"]))
    yield GaugeMetricFamily("llfabric_kept_memory_bytes", "Memory (PSS) the kept workers hold",
                            value=memory["kept"])
    evicted = CounterMetricFamily("llfabric_workers_evicted", "Kept workers made to leave "
                                  "before their idle time, by the limit passed "
                                  "(memory_pressure, kept_memory, user_memory) and how (retired, "
                                  "or cooled: dumped to disk)", labels=["why", "how"])
    for entry in memory["evicted"]:
        evicted.add_metric([entry["why"], entry["how"]], entry["count"])
    yield evicted

"""One policy's outcome as plain figures: GPU-hours, delays, waits, hosts over time."""

from __future__ import annotations

from typing import Any

from .simulate import Outcome

# A JSON object of a run's files (its description, a policy's figures, the sweep, a replay):
# written by this package and read back, checked, by the report.
Json = dict[str, Any]

INTERACTIVE_S = 0.1  # a delay a user does not see
CDF_POINTS = 400
HOST_SAMPLES = 2000
LEASES_KEPT = 30  # of each traced session: its first, enough to see the gaps between them
# (the report's label says 30 too)


def quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of an ascending list (nearest rank); 0 for an empty one."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _thin(points: list, count: int) -> list:
    step = max(1, len(points) // count)
    return points[::step]


def figures(outcome: Outcome) -> Json:
    """Every figure of `outcome`, JSON-ready; the delay CDF as (delay, share) points."""
    delays, waits = sorted(outcome.delays), sorted(outcome.waits)
    cells = len(delays)
    hosts = [n for _, n, _ in outcome.samples]
    return {
        "policy": outcome.policy,
        "cells": cells,
        "gpu_hours_provisioned": outcome.provisioned_gpu_s / 3600,
        "gpu_hours_held": outcome.held_gpu_s / 3600,
        "gpu_hours_busy": outcome.busy_gpu_s / 3600,
        "busy_of_held": outcome.busy_gpu_s / outcome.held_gpu_s if outcome.held_gpu_s else 0.0,
        "busy_of_provisioned": (outcome.busy_gpu_s / outcome.provisioned_gpu_s
                                if outcome.provisioned_gpu_s else 0.0),
        "share_under_100ms": sum(d < INTERACTIVE_S for d in delays) / cells if cells else 0.0,
        "delay_p50_s": quantile(delays, 0.5),
        "delay_p99_s": quantile(delays, 0.99),
        "delay_max_s": delays[-1] if delays else 0.0,
        "wait_share": sum(w > 0 for w in waits) / cells if cells else 0.0,
        "wait_p99_s": quantile(waits, 0.99),
        "wait_max_s": waits[-1] if waits else 0.0,
        "peak_hosts": outcome.peak_hosts,
        "mean_hosts": sum(hosts) / len(hosts) if hosts else 0.0,
        "paths": dict(sorted(outcome.paths.items())),
        "delay_cdf": [[quantile(delays, i / CDF_POINTS), i / CDF_POINTS]
                      for i in range(CDF_POINTS + 1)] if cells else [],
        "hosts_over_time": [list(s) for s in _thin(outcome.samples, HOST_SAMPLES)],
        "leases": {str(k): v[:LEASES_KEPT] for k, v in outcome.leases.items()},
    }


BASELINES = ("reservation", "notebookos")  # what savings are measured against
HEADLINE_HOURS = 17.5  # NotebookOS's headline: GPU-hours saved in 17.5 hours of its workload


def compare(by_policy: dict[str, dict], workload_hours: float) -> dict[str, dict[str, float]]:
    """Provisioned GPU-hours saved by each policy against each baseline: in percent, and per
    `HEADLINE_HOURS` of a workload `workload_hours` long."""
    saved: dict[str, dict[str, float]] = {}
    for name, figs in by_policy.items():
        saved[name] = {}
        for base in BASELINES:
            if base in by_policy and by_policy[base]["gpu_hours_provisioned"] > 0:
                ref = by_policy[base]["gpu_hours_provisioned"]
                saved[name][f"saved_vs_{base}_pct"] = \
                    100 * (1 - figs["gpu_hours_provisioned"] / ref)
        if "reservation" in by_policy and workload_hours > 0:
            saved[name]["saved_per_17h5"] = (
                (by_policy["reservation"]["gpu_hours_provisioned"] - figs["gpu_hours_provisioned"])
                * HEADLINE_HOURS / workload_hours)
    return saved

"""What the cluster asks of Ray's autoscaler.

Demand is a floor, not an increment (Ray's `request_resources`): every slot a cell holds now
plus one per cell waiting in the cluster's queue, as bundles of the slot's resource. The other
half, releasing idle hosts so that the autoscaler may take their nodes back, is the front
door's (`Door._release_idle`).
"""

from __future__ import annotations

from .host import SLOTS

HEAD = "node:__internal_head__"  # the resource only a Ray cluster's head node has


def demand(running: int, waiting: int, gpus: bool) -> list[dict[str, float]]:
    """The bundles to ask the autoscaler for; none while no cell waits (the ask is dropped, and
    the autoscaler scales down as it would)."""
    if not waiting:
        return []
    return [{"GPU" if gpus else SLOTS: 1.0}] * (running + waiting)

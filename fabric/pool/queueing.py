"""Which waiting lease requests get slots now, when requests ask for different numbers of them.

First come, first served, with a reservation and backfill (as batch schedulers do): the oldest
request is served as soon as enough slots are free; while it waits, the slots it needs are
reserved for it as they free, so a stream of small requests behind it cannot starve it. A later
request may jump ahead (backfill) only when it cannot delay that reservation: its estimated run
ends before the reservation's slots are expected free, or it fits in slots the reservation will
not need then. A request with no estimate never jumps ahead. Estimates can be wrong, so once
the oldest request has waited `patience` seconds nothing jumps ahead of it any more: its wait is
bounded by `patience` plus the longest run already under way (aging).

Plain data in, indices out: the caller (`leases`) owns the slots and the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PATIENCE = 60.0  # seconds the oldest request waits before backfill past it stops


@dataclass(frozen=True)
class LeaseRequest:
    size: int  # slots asked for
    since: float  # when it asked
    estimate: float | None = None  # expected seconds it will hold them; None: unknown


@dataclass(frozen=True)
class Holding:
    size: int  # slots held
    ends: float | None  # when they are expected back; None: unknown


def estimate(durations: Iterable[float]) -> float | None:
    """A session's next run, from its recent ones: the longest (a cautious guess), or None."""
    return max(durations, default=None)


def admit(free: int, queue: Sequence[LeaseRequest], held: Sequence[Holding], now: float,
          patience: float = PATIENCE) -> list[int]:
    """Indices into `queue` (oldest first) of the requests to grant now, in that order."""
    granted: list[int] = []
    index = 0
    while index < len(queue) and queue[index].size <= free:  # first come, first served
        free -= queue[index].size
        granted.append(index)
        index += 1
    if index == len(queue) or now - queue[index].since >= patience:
        return granted
    head = queue[index]
    shadow, spare = _reservation(head.size, free, held, now)
    if shadow is None:  # when the head's slots free is unknown: nothing may risk delaying it
        return granted
    for later in range(index + 1, len(queue)):
        request = queue[later]
        if request.size > free or request.estimate is None:
            continue
        if now + request.estimate <= shadow:  # done before the reservation starts
            free -= request.size
            granted.append(later)
        elif request.size <= spare:  # runs on past it, but on slots the head will not need
            free -= request.size
            spare -= request.size
            granted.append(later)
    return granted


def _reservation(size: int, free: int, held: Sequence[Holding],
                 now: float) -> tuple[float | None, int]:
    """When `size` slots are expected free (None: unknown), and how many more than `size` are
    free then."""
    available = free
    # a run past its estimate is taken to end now: the guess that leaves the least to backfill
    for ends, count in sorted((max(h.ends, now), h.size) for h in held if h.ends is not None):
        available += count
        if available >= size:
            return ends, available - size
    return None, 0

"""Which of a session's versions keep their state: the retention policy, a pure function.

Kept: the newest `last` versions, every named (tagged) or protected one (the head, what a draft
or a running cell builds on), and a thinned history of older ones: the newest version of each
of the last `hourly` clock hours and of the last `daily` days. Buckets are fixed clock
intervals, not windows sliding with `now`, so a version kept once is kept by the next pass too
until it ages out of its window: running the policy again on what it kept keeps all of it.

Design: a thinned version keeps its manifest and loses only its data. Manifests are small
(names, blob ids, the cell's source) and signed by the store's key; removing one from the middle
of the parent-linked chain would need either unsigned skip links beside it, which a reader would
have to trust, or every later manifest rewritten and re-signed, which moves the head under
running cells and drafts. Kept as a tombstone, the chain stays walkable as it was signed, `log`
still shows what each cell ran (lineage can still name the cells to re-run), and what retention
frees is where the bytes are: the objects and chunks only thinned versions name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ConfigError

HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class RetentionPolicy:
    last: int = 20  # the newest versions kept whole
    hourly: int = 24  # one version per clock hour, for this many hours
    daily: int = 7  # one version per day, for this many days

    def __post_init__(self) -> None:
        for name in ("last", "hourly", "daily"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"retention {name} must be a whole number >= 0, not {value!r}",
                                  key=name)

    def bound(self) -> int:
        """The most versions it keeps besides named and protected ones (the head included)."""
        return max(self.last, 1) + self.hourly + self.daily


@dataclass(frozen=True)
class Version:
    number: int
    time: float
    named: bool = False
    protected: bool = False


def keep(versions: Iterable[Version], policy: RetentionPolicy, now: float) -> set[int]:
    """The numbers of the versions whose state is kept; the highest number is the head."""
    ordered = sorted(versions, key=lambda v: v.number, reverse=True)
    if not ordered:
        return set()
    kept = {ordered[0].number}  # the head, even with last = 0
    kept |= {v.number for v in ordered[:policy.last]}
    kept |= {v.number for v in ordered if v.named or v.protected}
    for width, count in ((HOUR, policy.hourly), (DAY, policy.daily)):
        newest: dict[int, int] = {}  # bucket -> newest version in it
        for v in ordered:
            bucket = int(v.time // width)
            if 0 <= now // width - bucket < count:
                newest.setdefault(bucket, v.number)
        kept |= set(newest.values())
    return kept


def due(versions: Iterable[Version], policy: RetentionPolicy, now: float) -> float:
    """The earliest time after `now` at which `keep` may keep fewer of `versions` with no new
    one: when the oldest clock hour or day that holds one of them leaves its window (never,
    `math.inf`, if none is in one). Until then, running the policy again keeps all it kept."""
    versions, soonest = list(versions), math.inf
    for width, count in ((HOUR, policy.hourly), (DAY, policy.daily)):
        held = [b for v in versions if 0 <= now // width - (b := int(v.time // width)) < count]
        if held:
            soonest = min(soonest, (min(held) + count) * width)
    return soonest

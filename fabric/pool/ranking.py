"""Which kept worker leaves first when memory is short: the one whose loss costs least.

A kept worker saves its session's next cell a cold start. What keeping it is worth is how
likely that next cell is to come soon times what a cold start would cost it:

- likely: the more recently its user showed signs of working in it (its cell ending, a draft
  from their kernel as they edit the next cell, a completion or an inspection), the likelier;
- cost: the seconds its session's state took to ready on a fresh worker (at least MIN_REBUILD).

Workers whose state is all in the store leave first (a cold start rebuilds them), least worth
first, those whose user is editing the next cell (a draft in the last EDITING seconds, the
notebook in front of them) only after every other; pinned ones (holding values the store cannot
keep) last of all, and they are cooled (dumped to disk), never dropped.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

EDITING = 300.0  # seconds since a draft during which its user is taken to be editing
MIN_REBUILD = 0.1  # seconds


@dataclass(frozen=True)
class Kept:
    """What the ranking knows of one kept worker."""

    key: Hashable
    idle: float  # seconds since its user's latest sign of working in its session
    drafted: bool  # a draft reached it since its cell
    rebuild: float  # seconds its session's state took to ready on a fresh worker
    pinned: bool  # it holds values the store cannot keep

    @property
    def editing(self) -> bool:
        return self.drafted and self.idle <= EDITING

    @property
    def worth(self) -> float:
        return max(self.rebuild, MIN_REBUILD) / (1.0 + max(self.idle, 0.0))


def rank(kept: Iterable[Kept]) -> list[Kept]:
    """`kept` in the order they leave (see the module's notes)."""
    return sorted(kept, key=lambda k: (k.pinned, k.editing, k.worth))

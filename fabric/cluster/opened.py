"""A session as the cluster's front door knows it, kept by the door and read by its hosts'
bookkeeping (`membership`) and its placements (`moves`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..messages import Open, Placement

Key = tuple[str, str]  # (user, session)


@dataclass
class Opened:
    """A session as the door knows it: how it was opened, where, its last version."""

    request: Open
    host: str | None = None
    version: int = 0
    running: bool = False
    placement: Placement | None = None  # where the door last placed it, and why
    placed: str | None = None
    # what its next cell's client is told first: a version a lost host committed is kept
    kept: str | None = None
    # slot-seconds it leased on each host it left (a host counts on if it comes back)
    leased: dict[str, float] = field(default_factory=dict)
    # held while a cell is placed (and the session moved for it), while it closes, and while a
    # drain moves it: one of them at a time decides where it is
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)

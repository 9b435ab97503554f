"""Where a session's next cell runs, among a cluster's hosts: the one placement policy.

In order: the host the session is open on, if it can lease there now (its warm or parked worker
is there: no load at all); else the host holding most of the cell's closure bytes (its tiers
load them without a fetch); else the least loaded host with a free lease; else the cell
waits in the cluster's queue, first come first served, for the first host that frees a lease.
A host takes at most `oversubscribe` sessions per slot: past that, its sessions' cells would
mostly queue for its leases.

The policy is plain data in, a decision out: the front door gathers the views (`HostView`) and
the bytes each host holds of the closure, and carries the decision out (`fabric.cluster.door`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

OVERSUBSCRIBE = 7  # sessions per slot a host takes, as NotebookOS caps its GPU servers

Reason = Literal["kept", "locality", "least-loaded", "queued", "random"]
POLICIES = ("locality", "random")  # random: the baseline locality is measured against


@dataclass(frozen=True)
class HostView:
    """A host as the front door sees it now."""

    name: str
    slots: int  # leases it grants at once (GPUs, or CPU slots)
    running: int = 0  # cells holding or waiting for its leases
    sessions: int = 0  # sessions open on it
    draining: bool = False  # taking no new sessions (`llfabric drain`)

    def free(self) -> bool:
        """Whether a cell sent now would lease at once."""
        return self.running < self.slots

    def takes(self, oversubscribe: int) -> bool:
        """Whether a session not open here may open here."""
        return not self.draining and self.sessions < self.slots * oversubscribe


@dataclass(frozen=True)
class Decision:
    host: str | None  # None: queued, no host takes the session now
    reason: Reason
    held: int = 0  # bytes of the closure the chosen host holds

    def describe(self) -> str:
        return {"kept": "its worker's host has a free lease",
                "locality": f"holds {self.held} bytes of its closure",
                "least-loaded": "the least loaded host with a free lease",
                "queued": "every host is full; it waits for one",
                "random": "a host drawn at random among those with a free lease"}[self.reason]


def place(hosts: list[HostView], current: str | None, held: dict[str, int],
          oversubscribe: int = OVERSUBSCRIBE, lease: bool = True) -> Decision:
    """Where a cell of a session open on `current` (None: open nowhere) runs; `held`: bytes of
    its closure each host holds (memory and disk). `lease` False: where the session opens, a
    lease not needed now (hosts that take it, whether or not a lease is free there)."""
    by_name = {h.name: h for h in hosts}
    here = by_name.get(current) if current is not None else None
    if here is not None and not here.draining and (here.free() or not lease):
        return Decision(here.name, "kept", held.get(here.name, 0))
    open_to = [h for h in hosts if (h.free() or not lease) and not h.draining
               and (h is here or h.takes(oversubscribe))]
    holders = [h for h in open_to if held.get(h.name, 0) > 0]
    if holders:
        best = max(holders, key=lambda h: (held[h.name], -_load(h), h.name == current))
        return Decision(best.name, "locality", held[best.name])
    if open_to:
        best = min(open_to, key=lambda h: (_load(h), h.name))
        return Decision(best.name, "least-loaded", held.get(best.name, 0))
    return Decision(None, "queued")


def place_randomly(hosts: list[HostView], current: str | None, rng: random.Random,
                   oversubscribe: int = OVERSUBSCRIBE, lease: bool = True) -> Decision:
    """The baseline: any host that may take the cell, drawn at random, its worker or its
    bytes notwithstanding."""
    open_to = [h for h in hosts if (h.free() or not lease) and not h.draining
               and (h.name == current or h.takes(oversubscribe))]
    return Decision(rng.choice(open_to).name, "random") if open_to else Decision(None, "queued")


def _load(host: HostView) -> float:
    """Share of its slots in use, then of the sessions it may take."""
    return host.running / host.slots + host.sessions / (host.slots * OVERSUBSCRIBE * 10)

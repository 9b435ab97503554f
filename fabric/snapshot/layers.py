"""A store's tiers, built in the order its configuration names them, nearest first.

Each name in the order (the `tiers` setting) is one kind of tier (`KINDS`), built from the
store's place and settings; a kind left unconfigured (no remote URL, no peers) is left out. A
``module:factory`` name is a tier kind of another module: `factory(place)` builds it. A tier
object may stand in the order in place of a name. So a new kind of tier is a module of its own
and one line of configuration: its name in the order (or in `KINDS`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .peers import PeerList, PeerTier
from .remote import BehindTier, Remote, RemoteTier
from .tiers import DiskTier, MemoryTier, Role, Tier

ORDER = ("memory", "disk", "peer", "remote")  # nearest first: reads are sourced in this order
CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class Place:
    """What a store's tiers are built from."""

    blobs: Path  # the store's blobs folder, on this host's disk
    owner: tuple[int, int] | None = None  # the user its blobs belong to (`DiskTier`)
    cache_bytes: int = CACHE_BYTES  # the memory tier's size
    remote: str | Remote = ""  # an fsspec URL, or one with its settings (`RemoteTier`); "": none
    peers: PeerList | None = None  # a cluster's other hosts (`PeerTier`); None: none
    copies: int = 1  # the hosts each commit is kept on where no durable tier holds it


KINDS: dict[str, Callable[[Place], Tier | None]] = {
    "memory": lambda place: MemoryTier(place.cache_bytes),
    "disk": lambda place: DiskTier(place.blobs, place.owner),
    "peer": lambda place: None if place.peers is None else PeerTier(place.peers, place.copies),
    "remote": lambda place: _remote(place) if place.remote else None,
}


def _remote(place: Place) -> Tier:
    """The remote tier: written before each commit is acknowledged, or filled behind them."""
    remote = place.remote if isinstance(place.remote, Remote) else Remote(place.remote)
    manifests = place.blobs.parent / "manifests"  # the store's own, beside its blobs
    tier = RemoteTier(remote.url, remote.timeout,
                      abandoned=lambda ident: (manifests / ident).is_file())
    return BehindTier(tier) if remote.behind else tier


def build(order: Sequence[str | Tier], place: Place) -> list[Tier]:
    """The tiers `order` names (or gives), in its order; ConfigError for a kind not known, or
    an order without exactly one local disk."""
    tiers: list[Tier] = []
    for entry in order:
        tier = _kind(entry.strip())(place) if isinstance(entry, str) else entry
        if tier is not None:
            tiers.append(tier)
    if [t.role for t in tiers].count(Role.LOCAL) != 1:
        raise ConfigError("a store has one local disk among its tiers (`disk`)", key="tiers")
    return tiers


def _kind(name: str) -> Callable[[Place], Tier | None]:
    """The factory `name` names: one of `KINDS`, or ``module:factory``."""
    if name in KINDS:
        return KINDS[name]
    module, _, factory = name.partition(":")
    try:
        found: Callable[[Place], Tier | None] = getattr(importlib.import_module(module),
                                                        factory)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"no store tier is called {name!r}: one of {', '.join(KINDS)}, or "
                          f"module:factory ({exc})", key="tiers") from exc
    return found

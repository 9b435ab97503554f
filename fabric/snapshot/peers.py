"""The peer tier: blobs read from the disks of a cluster's other hosts, before the remote tier.

What the store sees of its peers: which host holds which blob, read from the one that does; the
manifests and heads they hold; and, without a remote tier, the hosts a commit is kept on
(`keep`: each pulls what it lacks through its own peer tier and takes the version as its head of
the session). How a host is reached (a socket, its keys, the list of hosts) is the cluster's
(`fabric.cluster.peers`), which gives the tier its hosts as `PeerStore`s. A blob comes whole
and is checked against its name by the store, like any tier's: a peer that sends the wrong
bytes is caught, never trusted.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

from ..errors import StoreError
from .tiers import Buffer, Role

log = logging.getLogger(__name__)
T = TypeVar("T")


class PeerStore(Protocol):
    """Another host's store, as the cluster reaches it; StoreError where it cannot answer."""

    @property
    def name(self) -> str: ...

    def sizes(self, idents: list[str]) -> list[int | None]:
        """The size of each of `idents` it holds; None for each it lacks."""
        ...

    def read(self, ident: str) -> bytes | None:
        """The blob, None if it lacks it."""
        ...

    def manifest(self, ident: str) -> bytes | None:
        """A manifest as its store keeps it (signed), None if it lacks it."""
        ...

    def head(self, session: str) -> str | None: ...

    def keep(self, session: str, head: str) -> None:
        """Hold version `head` of `session` whole; returns once it does."""
        ...


PeerList = Callable[[], Sequence[PeerStore]]  # the cluster's other hosts, as they are now


class PeerTier:
    """The other hosts' blobs, as a read-only far tier (`fabric.snapshot.tiers.Located`)."""

    name, role = "peer", Role.FAR
    durable = False  # a peer may go at any time: a commit never counts on one

    def __init__(self, hosts: PeerList, copies: int = 1) -> None:
        """`copies`: the hosts, this one included, each commit is kept on where no durable
        tier holds it (`fabric.snapshot.commit.spread`)."""
        self.hosts, self.copies = hosts, copies
        self._where: dict[str, tuple[PeerStore, int]] = {}  # blob -> where `locate` found it, size

    def __str__(self) -> str:
        return "a peer host"

    def locate(self, idents: list[str]) -> dict[str, int]:
        """Which of `idents` some peer holds (their sizes); the peer is remembered for `read`."""
        found: dict[str, int] = {}
        for host in self.hosts():
            wanted = [i for i in idents if i not in found]
            if not wanted:
                break
            try:
                sizes = host.sizes(wanted)
            except StoreError as exc:
                log.info("peer %s cannot say what it holds: %s", host.name, exc.message)
                continue
            for ident, size in zip(wanted, sizes, strict=False):
                if size is not None:
                    found[ident], self._where[ident] = size, (host, size)
        return found

    # the Tier protocol, for the blobs `locate` found
    def has(self, ident: str) -> bool:
        return ident in self._where

    def size(self, ident: str) -> int | None:
        known = self._where.get(ident)
        return known[1] if known is not None else self.locate([ident]).get(ident)

    def read_into(self, ident: str, out: memoryview) -> int | None:
        if ident not in self._where:
            return None
        host, _ = self._where[ident]
        data = host.read(ident)
        if data is None:
            return None
        out[:min(len(data), out.nbytes)] = data[:out.nbytes]
        return len(data)

    def write(self, ident: str, data: Buffer) -> None:
        raise StoreError("the peer tier is read-only")

    # manifests, heads and copies
    def manifest(self, ident: str) -> bytes | None:
        for _, data in self._answers(self.hosts(), lambda h: h.manifest(ident),
                                     f"give manifest {ident}"):
            if data is not None:
                return data
        return None

    def heads(self, session: str) -> list[str]:
        return [head for _, head in self._answers(self.hosts(), lambda h: h.head(session),
                                                  f"say its head of {session}")
                if head is not None]

    def keep(self, session: str, head: str) -> list[str]:
        """Peers are asked in an order of the session's own (each session's copies spread over
        the hosts, and go to the same ones while they last)."""
        order = sorted(self.hosts(), key=lambda h: zlib.crc32(f"{session}/{h.name}".encode()))
        kept: list[str] = []
        if self.copies <= 1:
            return kept
        for host, _ in self._answers(order, lambda h: h.keep(session, head),
                                     f"keep session {session}'s version"):
            kept.append(host.name)
            if len(kept) == self.copies - 1:
                break
        return kept

    def _answers(self, hosts: Sequence[PeerStore], ask: Callable[[PeerStore], T],
                 what: str) -> Iterator[tuple[PeerStore, T]]:
        """`ask` of each of `hosts` in turn: the answers of those that give one (one that
        cannot, `what` it was asked, is logged and passed over)."""
        for host in hosts:
            try:
                answer = ask(host)
            except StoreError as exc:
                log.warning("peer %s cannot %s: %s", host.name, what, exc.message)
                continue
            yield host, answer

"""Committing a version: a worker's save report folded into a new manifest, the head moved.

The report comes from a worker process, so it is checked as input from outside: its shape on
receipt (`worker.messages`), then here: one that names a blob the store does not hold commits
nothing (a head must never point at missing data), and no version is built on a head whose
manifest is damaged. The head moves by compare-and-set: a commit on a head that moved meanwhile
is refused.

A cell that changes nothing (no variable, import or ambient state added, changed or deleted:
`print(x)`, `x`) makes no version: the head stays, and retention keeps its slots for the versions
that hold work. A session holding values that could not be saved gets a version for each cell
all the same: their lineage, which rebuilds them, is its versions' cells.

A commit is durable in three steps, in this order, before its cell is reported done:
`replicate` (the blobs the worker wrote go to every durable far tier: a remote), `commit` (the
manifest and the head, on this disk and on the far tiers that hold heads, which claim the move
first), then `spread` (where no far tier holds whole commits, other hosts keep the version, up
to `copies` of them). Its host runs the first two under the cell's lease, the third after it.
A remote that fails either of the first two fails the commit (`RemoteFailed`, `RemoteFull`):
the head stays where it was, and the cell is told that nothing of it was committed. A remote
filled behind the commits (`fabric.snapshot.behind`) is no durable tier: a commit only wakes
its sender.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from ..errors import RemoteFailed, StoreError
from . import catalog
from .manifest import Group, Manifest
from .remote import BehindTier
from .store import Store
from .tiers import Located, Shared

log = logging.getLogger(__name__)


def head_manifest(store: Store, session: str, head: str | None) -> Manifest:
    """The manifest `head` names, checked (hash, signature) as a new version's parent."""
    if head is None:
        return Manifest(session=session)
    try:
        return Manifest.decode(store.get_manifest(head))
    except StoreError as exc:
        raise StoreError(f"session {session}'s head is damaged ({exc.message}): no cell "
                         "can commit on it; `llfabric store verify --repair` brings it back "
                         "to its newest intact version",
                         session=session, head=head) from exc


@dataclass(frozen=True)
class Report:
    """What a worker's save after a cell wrote (`Worker.save`), as its `done` message carries
    it (checked there, on receipt)."""

    groups: list[tuple[str, list[str], int]]  # [blob, names, bytes] of each group written
    kept: list[str]  # names whose group did not change
    imports: dict[str, str]  # alias -> module
    refs: dict[str, list[str]]  # of the regrouped names only
    packages: dict[str, list[str]]  # likewise
    ambient: str  # the blob of the ambient state after the cell
    owned: list[str]  # every name the worker speaks for: one missing was deleted
    unsaved: dict[str, str]  # name -> why it cannot be saved
    bounded: bool = False  # its grouping walk was cut short
    hooks: list[str] = field(default_factory=list[str])  # import hooks the notebook defined
    # a `catalog.Catalog`
    described: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])
    devices: list[str] = field(default_factory=list[str])  # blobs of the groups holding CUDA memory


@dataclass(frozen=True)
class CellRecord:
    """The cell a version records: its source, how it ended, and the packages it imports."""

    source: str
    execution_count: int
    status: str
    run: float  # seconds its code ran
    modules: frozenset[str]  # what it imports that counts toward an import closure
    # its environment and packages (`Manifest.env`)
    env: dict[str, Any] = field(default_factory=dict[str, Any])


def commit(store: Store, session: str, head: str | None, report: Report, cell: CellRecord,
           admit: Callable[[Manifest], None] | None = None) -> tuple[str | None, Manifest]:
    """Commit what `cell` left, as its worker's save `report` says, on `head`; `admit` may
    refuse the version (it raises). The new head's id and manifest: `head`'s own where the cell
    changed nothing."""
    owned = set(report.owned) - set(report.kept)  # kept: stay as committed
    new_groups = [Group(blob, tuple(names), size, blob in report.devices)
                  for blob, names, size in report.groups]
    for blob in [g.blob for g in new_groups] + [report.ambient]:
        if not store.has(blob):  # a head must never point at missing data
            raise StoreError(f"the worker reported blob {blob!r} that is not in the store")
    parent = head_manifest(store, session, head)
    kept = [Group(g.blob, tuple(n for n in g.names if n not in owned), g.size, g.device)
            for g in parent.groups]
    manifest = Manifest(
        session=session,
        version=parent.version + 1,
        parent=head,
        groups=tuple(g for g in kept if g.names) + tuple(new_groups),
        imports={a: m for a, m in parent.imports.items() if a not in owned} | report.imports,
        refs={n: r for n, r in parent.refs.items() if n not in owned}
        | {n: tuple(r) for n, r in report.refs.items()},
        packages={n: p for n, p in parent.packages.items() if n not in owned}
        | {n: tuple(p) for n, p in report.packages.items()},
        ambient=report.ambient,
        modules=tuple(sorted(set(parent.modules) | cell.modules)),
        hooks=tuple(report.hooks),
        cell={"execution_count": cell.execution_count, "status": cell.status,
              "source": cell.source, "time": time.time(),
              "unsaved": sorted(report.unsaved),  # lineage, for a cold restore
              "run": cell.run},
        env=cell.env,
    )
    if _same_state(parent, manifest) and not report.unsaved and not parent.cell.get("unsaved"):
        return head, parent
    with uncommitted(session, parent.version):
        manifest = dataclasses.replace(manifest,
                                       catalog=_catalog(store, parent, manifest, report))
        if admit is not None:
            admit(manifest)
        ident = store.put_manifest(manifest.encode())
        store.set_head(session, ident, head)  # refused if the head moved
    _wake_behind(store)
    return ident, manifest


def _wake_behind(store: Store) -> None:
    """Wake the sender of a remote filled behind, if the store has one: a head moved."""
    for tier in store.far:
        if isinstance(tier, BehindTier):
            tier.committed.set()


@contextlib.contextmanager
def uncommitted(session: str, version: int) -> Generator[None, None, None]:
    """A remote's failure in the block, told as what it means to the cell: its state is not
    committed, and the session stays at `version`."""
    try:
        yield
    except RemoteFailed as exc:
        raise type(exc)(f"{exc.message}; nothing of the cell is committed: session {session} "
                        f"stays at version {version}", **exc.fields) from exc


def _same_state(parent: Manifest, manifest: Manifest) -> bool:
    """Whether `manifest` holds what `parent` does: every field but its cell's record, its
    groups in any order (a worker that loaded them saves them in the order it holds them)."""
    return set(manifest.groups) == set(parent.groups) and dataclasses.replace(
        manifest, version=parent.version, parent=parent.parent, cell=parent.cell,
        catalog=parent.catalog, groups=parent.groups) == parent


def _catalog(store: Store, parent: Manifest, manifest: Manifest, report: Report) -> str | None:
    """The blob of the new version's catalog: the cell's descriptions over the parent's. A
    parent's catalog that cannot be read only leaves its names undescribed."""
    earlier: catalog.Catalog = {}
    if parent.catalog:
        try:
            earlier = catalog.decode(store.get(parent.catalog, catalog.LIMIT))
        except StoreError as exc:
            log.warning("session %s: the catalog of version %d is not read: %s",
                        manifest.session, parent.version, exc.message)
    names = manifest.names() | set(report.unsaved)
    merged = catalog.merge(earlier, report.described, names)
    if not merged["names"]:
        return None
    blob = store.put(catalog.encode(merged))
    store.replicate([blob])  # a durable far tier that lacks it gets it, though this disk had it
    return blob


def replicate(store: Store, session: str, head: Manifest, report: Report) -> int:
    """Before the head moves from `head`: every durable far tier holds the blobs `report` names
    (objects with their chunks); the bytes copied."""
    with uncommitted(session, head.version):
        return store.replicate([*(blob for blob, _, _ in report.groups), report.ambient])


@dataclass(frozen=True)
class Spread:
    """On how many hosts a version is, of the `copies` asked for."""

    copies: int
    held: int

    @property
    def short(self) -> int:
        """How many hosts short of `copies` it stays (0: none)."""
        return self.copies - self.held


def spreads(store: Store) -> bool:
    """Whether a commit goes on to other hosts after its head moves: no far tier holds whole
    commits (`Shared`), and one that keeps versions is asked for more than one copy."""
    return not any(isinstance(t, Shared) for t in store.far) and \
        any(t.copies > 1 for t in _keepers(store))


def spread(store: Store, session: str, head: str) -> Spread:
    """After the head moves: have other hosts keep the session's version `head` until it is
    on `copies` hosts, this one included, where `spreads`."""
    if not spreads(store):
        return Spread(1, 1)
    keeper = next(t for t in _keepers(store) if t.copies > 1)
    return Spread(keeper.copies, 1 + len(keeper.keep(session, head)))


def _keepers(store: Store) -> list[Located]:
    return [t for t in store.far if isinstance(t, Located)]

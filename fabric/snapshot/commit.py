"""Committing a version: a worker's save report folded into a new manifest, the head moved.

The report comes from a worker process, so it is checked as input from outside: a malformed one,
or one that names a blob the store does not hold, commits nothing (a head must never point at
missing data), and no version is built on a head whose manifest is damaged. The head moves by
compare-and-set: a commit on a head that moved meanwhile is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import StoreError
from ..plan import CellPlan
from .manifest import Group, Manifest
from .store import Store


def head_manifest(store: Store, session: str, head: str | None) -> Manifest:
    """The manifest `head` names, checked (hash, signature) as a new version's parent."""
    if head is None:
        return Manifest(session=session)
    try:
        return Manifest.decode(store.get_manifest(head))
    except StoreError as exc:
        raise StoreError(f"session {session}'s head is damaged ({exc.message}): no cell "
                         "can commit on it; `llfabric store verify` tells more",
                         session=session, head=head) from exc


def commit(store: Store, session: str, head: str | None, report: dict, cell: CellPlan,
           count: int, admit: Callable[[Manifest], None] | None = None) -> tuple[str, Manifest]:
    """Commit what cell `count` (`cell`) left, as its worker's `done` report says, on `head`;
    `admit` may refuse the version (it raises). The new head's id and manifest."""
    try:
        owned = set(report["owned"]) - set(report.get("kept", ()))  # kept: stay as committed
        new_groups = [Group(str(b), tuple(map(str, names)), int(size))
                      for b, names, size in report["groups"]]
        imports = {str(k): str(v) for k, v in report["imports"].items()}
        refs = {str(k): tuple(map(str, v)) for k, v in report["refs"].items()}
        packages = {str(k): tuple(map(str, v)) for k, v in report["packages"].items()}
        unsaved = sorted(map(str, report.get("unsaved") or {}))  # lineage for a cold restore
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"the worker sent a malformed save report: {exc}") from exc
    blobs = [g.blob for g in new_groups] + [report.get("ambient")]
    for blob in blobs:  # a head must never point at missing data
        if not isinstance(blob, str) or not store.has(blob):
            raise StoreError(f"the worker reported blob {blob!r} that is not in the store")
    parent = head_manifest(store, session, head)
    kept = [Group(g.blob, tuple(n for n in g.names if n not in owned), g.size)
            for g in parent.groups]
    manifest = Manifest(
        session=session,
        version=parent.version + 1,
        parent=head,
        groups=tuple(g for g in kept if g.names) + tuple(new_groups),
        imports={a: m for a, m in parent.imports.items() if a not in owned} | imports,
        refs={n: r for n, r in parent.refs.items() if n not in owned} | refs,
        packages={n: p for n, p in parent.packages.items() if n not in owned} | packages,
        ambient=report["ambient"],
        modules=tuple(sorted(set(parent.modules) | cell.modules)),
        cell={"execution_count": count, "status": report["status"],
              "source": cell.source, "time": time.time(), "unsaved": unsaved,
              "run": float(report.get("run") or 0.0)},
    )
    if admit is not None:
        admit(manifest)
    ident = store.put_manifest(manifest.encode())
    store.set_head(session, ident, head)  # refused if the head moved
    return ident, manifest

"""A session's versions, time travel, and the store's upkeep (verify, gc).

Checkout never moves a head backwards: it commits a new version whose state is the old one's, so
every version stays reachable from a head, `log` still shows what came after, and gc can treat
"reachable from some head" as "live".

gc runs while servers save: a worker writes chunks and an object before the server commits the
manifest naming them, and a save that finds an intact blob already there touches it instead of
writing. So only unreachable files older than a grace period are removed, and the chunks of a
young object are kept with it. A session whose history cannot be read whole is damaged: gc keeps
every version of it that still reads, and goes on with the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..closure.static import analyze
from ..errors import StoreError
from .manifest import Manifest
from .store import Store, blob_id
from .tiers import Tier

GRACE_SECONDS = 3600.0  # longer than any save between its first write and its commit


def log(store: Store, session: str) -> list[tuple[str, Manifest]]:
    """The session's versions, newest first: (manifest id, manifest)."""
    versions: list[tuple[str, Manifest]] = []
    ident, seen = store.head(session), set()
    while ident is not None:
        if ident in seen:
            raise StoreError(f"session {session} has a cycle in its history", session=session)
        seen.add(ident)
        manifest = Manifest.decode(store.get_manifest(ident))
        versions.append((ident, manifest))
        ident = manifest.parent
    return versions


def lineage(store: Store, session: str, names: list[str]) -> list[int]:
    """The cells (execution counts) that made `names`, state that could not be saved, as it was:
    for each name, the last cell that left it unsaved after writing it, and every later cell that
    reached it. Re-running them in order recomputes it."""
    cells: set[int] = set()
    for name in names:
        reached = []
        for _, manifest in log(store, session):
            cell = manifest.cell
            analysis = analyze(str(cell.get("source") or ""))
            if name in analysis.reads | analysis.writes or not analysis.parsed:
                reached.append(int(cell.get("execution_count", 0)))
            if name in analysis.writes and name in cell.get("unsaved", ()):
                cells.update(reached)
                break
    return sorted(cells)


def recompute_hint(store: Store, session: str, names: list[str]) -> str:
    """A clause telling the user which cells to re-run to recompute lost `names`."""
    cells = lineage(store, session, names)
    if not cells:
        return ""
    return f" (re-run cell{'s' if len(cells) > 1 else ''} {', '.join(map(str, cells))} to " \
        "recompute them)"


def size(manifest: Manifest) -> int:
    return sum(g.size for g in manifest.groups)


def checkout(store: Store, session: str, version: int) -> Manifest:
    """Make `version`'s state the session's next one; returns the new head manifest."""
    versions = log(store, session)
    if not versions:
        raise StoreError(f"session {session} has no versions", session=session)
    head_id, head = versions[0]
    old = next((m for _, m in versions if m.version == version), None)
    if old is None:
        raise StoreError(f"session {session} has no version {version} "
                         f"(it has 0 to {head.version})", session=session)
    manifest = dataclasses.replace(
        old, version=head.version + 1, parent=head_id,
        cell={"execution_count": head.cell.get("execution_count", 0), "status": "ok",
              "source": "", "checkout": version, "time": time.time()})
    store.set_head(session, store.put_manifest(manifest.encode()), head_id)
    return manifest


@dataclass
class Verified:
    manifests: int = 0
    blobs: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)  # blobs rewritten from a good copy


def verify(store: Store, repair: bool = False, sources: Iterable[Tier] = ()) -> Verified:
    """Check every manifest's signature, every blob's hash, and that every head's history is
    complete (every object and chunk it names is present). With `repair`, rewrite corrupt
    blobs from a good copy (another tier, or `sources`); a problem names what a corrupt blob
    that could not be repaired leaves broken."""
    result = Verified()
    for ident in store.manifests():
        result.manifests += 1
        try:
            Manifest.decode(store.get_manifest(ident))
        except StoreError as exc:
            result.problems.append(exc.message)
    corrupt = []
    for ident in store.disk.idents():
        path = store.disk.path(ident)
        data = path.read_bytes()
        result.blobs += 1
        result.bytes += len(data)
        if blob_id(data) != ident:
            if repair and store.repair(ident, sources):
                result.repaired.append(ident)
            else:
                corrupt.append(ident)
    names: dict[str, set[str]] = {}  # session -> what its history names (up to a problem)
    for session in store.sessions():
        names[session] = set()
        try:
            _mark(store, session, names[session])
        except StoreError as exc:
            result.problems.append(f"session {session}: {exc.message}")
    for ident in corrupt:
        users = sorted(s for s, named in names.items() if ident in named)
        result.problems.append(f"blob {ident} is corrupt (hash mismatch)"
                               + (", and no good copy was found to repair it" if repair else "")
                               + (f"; sessions {', '.join(users)} need it" if users else ""))
    return result


def _mark(store: Store, session: str, live: set[str]) -> set[str]:
    """Add to `live` every manifest, object, chunk and blob the session's history names;
    raise if any of them is missing."""
    def blob(ident: str) -> None:
        if not store.has(ident):
            raise StoreError(f"blob {ident} is missing", blob=ident)
        live.add(ident)

    for ident, manifest in log(store, session):
        live.add(ident)
        if manifest.ambient:
            blob(manifest.ambient)
        for group in manifest.groups:
            if group.blob not in live:
                blob(group.blob)
                for chunk in store.object_chunks(group.blob):
                    blob(chunk)
    return live


def _keep_damaged(store: Store, sessions: set[str], live: set[str]) -> None:
    """Add to `live` what damaged `sessions` may still need, their histories being unreadable:
    their heads, every manifest of theirs that still reads, and whatever those name."""
    for session in sessions:
        with contextlib.suppress(StoreError):
            live.add(store.head(session) or "")
    for ident in store.manifests():
        try:
            manifest = Manifest.decode(store.get_manifest(ident))
        except StoreError:
            continue
        if manifest.session not in sessions:
            continue
        live.add(ident)
        live.update(b for b in (manifest.ambient, *(g.blob for g in manifest.groups)) if b)
        for group in manifest.groups:
            with contextlib.suppress(StoreError, OSError):
                live.update(store.object_chunks(group.blob))


@dataclass
class Collected:
    removed: int = 0
    freed: int = 0
    kept: int = 0
    kept_bytes: int = 0
    damaged: dict[str, str] = field(default_factory=dict)  # session -> why, kept whole


def gc(store: Store, grace: float = GRACE_SECONDS) -> Collected:
    """Remove manifests, blobs and crash leftovers that no session's history names and that are
    older than `grace` seconds. A damaged session (its history cannot be read completely) is
    reported and keeps every version that still reads; the others are collected as usual."""
    young = time.time() - grace
    live: set[str] = set()
    result = Collected()
    for session in store.sessions():
        try:
            _mark(store, session, live)
        except StoreError as exc:
            result.damaged[session] = exc.message
    if result.damaged:
        _keep_damaged(store, set(result.damaged), live)
    stats = {}
    for path in [*store.disk.files(), *(store.root / "manifests").iterdir()]:
        with contextlib.suppress(FileNotFoundError):  # a temp file renamed meanwhile
            stats[path] = path.stat()
    for path, stat in stats.items():
        if stat.st_mtime >= young and path.parent.parent == store.disk.root \
                and store.is_object(path.name):
            with contextlib.suppress(StoreError):  # a corrupt one names nothing to keep
                live.update(store.object_chunks(path.name))  # a save in flight: its chunks
    for path, stat in stats.items():
        if path.name in live or stat.st_mtime >= young:
            result.kept += 1
            result.kept_bytes += stat.st_size
        else:
            path.unlink(missing_ok=True)
            result.removed += 1
            result.freed += stat.st_size
    return result

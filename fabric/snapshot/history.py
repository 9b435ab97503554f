"""A session's versions, time travel, and the store's upkeep (verify, gc).

Checkout never moves a head backwards: it commits a new version whose state is the old one's, so
every version stays reachable from a head, `log` still shows what came after, and gc can treat
"reachable from some head" as "live".

gc runs while servers save: a worker writes chunks and an object before the server commits the
manifest naming them, and a save that finds an intact blob already there touches it instead of
writing. So only unreachable files older than a grace period are removed, and the chunks of a
young object are kept with it. A session whose history cannot be read whole is damaged: gc keeps
every version of it that still reads, and goes on with the others.

Retention (`retain`, the policy in `retention`) thins a session's history: a thinned version
keeps its manifest, a tombstone `log` still shows, and loses its data. The session's index
records when each was thinned; gc frees what only thinned versions (or removed sessions) name
at once, not after the grace period, unless a save touched it after it was released: a save
that finds an intact blob already there touches it, and a commit then names it.

`retain` and `gc` look at the whole store; the server's upkeep does the same work for what
changed since its last pass (`ledger.Ledger`), with `thin`, `mark` and `sweep`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..closure.plan import plan
from ..errors import StoreError
from . import retention
from .manifest import Manifest
from .store import Index, Store
from .tiers import Tier, write_atomic

GRACE_SECONDS = 3600.0  # longer than any save between its first write and its commit
VERIFIED = "verified"  # in the store's root: when the last full verify that found all well began


def log(store: Store, session: str, start: str | None = None) -> list[tuple[str, Manifest]]:
    """The session's versions, newest first: (manifest id, manifest); from its head, or from
    version `start` back."""
    versions: list[tuple[str, Manifest]] = []
    ident, seen = start or store.head(session), set[str]()
    while ident is not None:
        if ident in seen:
            raise StoreError(f"session {session} has a cycle in its history", session=session)
        seen.add(ident)
        manifest = Manifest.decode(store.get_manifest(ident))
        versions.append((ident, manifest))
        ident = manifest.parent
    return versions


def intact(store: Store, session: str) -> list[tuple[str, Manifest]]:
    """Every version of the session whose manifest still reads (hash and signature), newest
    first, found by reading every manifest: what is left when its head's history is not."""
    found: list[tuple[str, Manifest]] = []
    for ident in store.manifests():
        with contextlib.suppress(StoreError):
            manifest = Manifest.decode(store.get_manifest(ident))
            if manifest.session == session:
                found.append((ident, manifest))
    return sorted(found, key=lambda v: (v[1].version, float(v[1].cell.get("time", 0))),
                  reverse=True)


def restore_head(store: Store, session: str) -> str | None:
    """Bring back a session whose head cannot be read (a corrupt or missing manifest, a corrupt
    head file): the manifest from the remote tier or a peer where one holds it good, else the
    head moved to the newest version whose history reads whole. What was done, None if the
    head reads or nothing could bring it back."""
    head = None
    try:
        head = store.head(session)
        if head is None:
            return None
        store.get_manifest(head)
        return None
    except StoreError as exc:
        damage = exc.message
    if head is not None and store.repair_manifest(head):
        return f"session {session}: its head manifest {head} was restored from a good copy"
    for ident, manifest in intact(store, session):
        try:
            log(store, session, ident)
        except StoreError:
            continue
        store.restore_head(session, ident, head)
        return (f"session {session}: its head could not be read ({damage}); it is back at "
                f"version {manifest.version}, the newest intact one: what a later version "
                "held is lost" + (f" (its damaged manifest is kept in {store.root / 'damaged'})"
                                  if head is not None else ""))
    return None


def rebuild_index(store: Store, session: str) -> str | None:
    """Write a session's index afresh where it is missing or malformed: the versions whose data
    is gone marked thinned (retention's, most likely), and the names the remote tier holds;
    what this cannot know (other names, its own retention policy) is said to be lost. What was
    done, None if the index reads."""
    try:
        if store.has_index(session):
            store.index(session)
            return None
        why = "was missing"
    except StoreError as exc:
        why = f"was unreadable ({exc.message})"
    versions = log(store, session)
    gone = {ident: 0.0 for ident, manifest in versions if not _whole(store, manifest)}
    with store.locked(session):
        store.set_index(session, Index(thinned=gone))
        store.adopt_tags(session)
        names = sorted(store.index(session).tags)
    return (f"session {session}: its index {why} and was rebuilt: {len(gone)} versions whose "
            f"data is gone are marked thinned; names kept: {', '.join(names) or 'none'}; any "
            "other names and its own retention policy are lost")


def _whole(store: Store, manifest: Manifest) -> bool:
    """Whether every blob a version names is on this disk (its chunks too)."""
    try:
        _mark_version(store, manifest, set())
        return True
    except (StoreError, OSError):
        return False


def cells(store: Store, session: str,
          after: Mapping[str | None, list[tuple[int, str]]] | None = None,
          ) -> list[tuple[int, str]]:
    """The session's cells, oldest first: (execution count, source); checkouts ran none.
    `after`: cells that made no version, by the version (its id) they ran on."""
    after = after or {}
    ran = list(after.get(None, []))
    for ident, m in reversed(log(store, session)):
        if "checkout" not in m.cell:
            ran.append((int(m.cell.get("execution_count", 0)), str(m.cell.get("source") or "")))
        ran.extend(after.get(ident, []))
    return ran


CHANGED_NAMES = 20  # names listed per kind of change in `describe`; the rest are counted


def describe(versions: list[tuple[str, Manifest]], index: Index) -> list[dict[str, Any]]:
    """The versions of `log` (newest first) as a history view shows them: prompt number, the
    cell's first line (or the version a checkout went back to), time, size (None: thinned by
    retention), names, and the variables and imports it added, changed or removed."""
    names: dict[str, list[str]] = {}
    for name, ident in index.tags.items():
        names.setdefault(ident, []).append(name)
    described: list[dict[str, Any]] = []
    for at, (ident, m) in enumerate(versions):
        before = versions[at + 1][1] if at + 1 < len(versions) else Manifest(session=m.session)
        now, then = _bindings(m), _bindings(before)
        lines = str(m.cell.get("source") or "").strip().splitlines()
        described.append({
            "version": m.version, "execution_count": int(m.cell.get("execution_count", 0)),
            "first_line": lines[0][:120] if lines else "", "lines": len(lines),
            "status": str(m.cell.get("status", "")), "time": float(m.cell.get("time", 0)),
            "checkout": m.cell.get("checkout"), "tags": sorted(names.get(ident, [])),
            "size": None if ident in index.thinned else size(m),
            "variables": len(m.variables()),
            "unsaved": list(m.cell.get("unsaved", ()))[:CHANGED_NAMES],
            **_changes(now, then)})
    return described


def _bindings(manifest: Manifest) -> dict[str, str]:
    """What each name of a version is bound to: its group's blob, or its import's module."""
    bound = {name: f"import {module}" for name, module in manifest.imports.items()}
    bound.update({name: g.blob for name, g in manifest.variables().items()})
    return bound


def _changes(now: dict[str, str], then: dict[str, str]) -> dict[str, list[str] | int]:
    changes = {"added": sorted(set(now) - set(then)), "removed": sorted(set(then) - set(now)),
               "changed": sorted(n for n in set(now) & set(then) if now[n] != then[n])}
    listed: dict[str, list[str] | int] = {kind: found[:CHANGED_NAMES]
                                           for kind, found in changes.items()}
    listed["more"] = sum(max(0, len(found) - CHANGED_NAMES) for found in changes.values())
    return listed


def lineage(store: Store, session: str, names: list[str]) -> list[int]:
    """The cells (execution counts) that made `names`, state that could not be saved, as it was:
    for each name, the last cell that left it unsaved after writing it, and every later cell that
    reached it. Re-running them in order recomputes it."""
    cells: set[int] = set()
    for name in names:
        reached: list[int] = []
        for _, manifest in log(store, session):
            cell = manifest.cell
            analysis = plan(str(cell.get("source") or "")).analysis
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


def checkout(store: Store, session: str, version: int | str) -> Manifest:
    """Make `version`'s state (a number or a tag) the session's next one; returns the new head
    manifest. A thinned version is refused, naming those that can still be checked out.
    Version 0 is the empty state before the first cell: after it, prompt numbers start at 1
    again, as after a kernel restart (what a Jupyter user asks for with Restart)."""
    with store.locked(session):  # retention cannot thin `version` between reading and commit
        versions = log(store, session)
        if not versions:
            raise StoreError(f"session {session} has no versions", session=session)
        index = store.index(session)
        head_id, head = versions[0]
        if version in (0, "0"):
            return _commit_checkout(store, session, head_id, head, Manifest(session=session), 0)
        old_id, old = resolve(store, session, version, versions, index)
        if old_id in index.thinned:
            raise StoreError(f"version {old.version} of session {session} was thinned away by "
                             f"retention; these remain: {remaining(versions, index)}",
                             session=session, version=old.version)
        return _commit_checkout(store, session, head_id, head, old,
                                head.cell.get("execution_count", 0))


def _commit_checkout(store: Store, session: str, head_id: str, head: Manifest, old: Manifest,
                     count: int) -> Manifest:
    """Commit `old`'s state as the version after `head`, its cell numbered `count`."""
    manifest = dataclasses.replace(
        old, version=head.version + 1, parent=head_id,
        cell={"execution_count": count, "status": "ok", "source": "", "checkout": old.version,
              "time": time.time()})
    store.set_head(session, store.put_manifest(manifest.encode()), head_id, held=True)
    return manifest


def resolve(store: Store, session: str, version: int | str | None,
            versions: list[tuple[str, Manifest]], index: Index) -> tuple[str, Manifest]:
    """The (id, manifest) that a version number or a tag names; None: the head."""
    if version is None:
        return versions[0]
    if isinstance(version, str) and not version.isdigit():
        ident = index.tags.get(version)
        found = next(((i, m) for i, m in versions if i == ident), None)
        if found is None:
            raise StoreError(f"session {session} has no version named {version!r}; its names: "
                             f"{', '.join(sorted(index.tags)) or 'none'}", session=session)
        return found
    found = next(((i, m) for i, m in versions if m.version == int(version)), None)
    if found is None:
        raise StoreError(f"session {session} has no version {version} (it has 0 to "
                         f"{versions[0][1].version})", session=session)
    return found


def remaining(versions: list[tuple[str, Manifest]], index: Index) -> str:
    """The versions whose state is kept, newest first, with their names."""
    names: dict[str, list[str]] = {}
    for name, ident in index.tags.items():
        names.setdefault(ident, []).append(name)
    return ", ".join(f"{m.version}" + (f" ({', '.join(sorted(names[i]))})" if i in names else "")
                     for i, m in versions if i not in index.thinned)


def valid_tag(name: object) -> bool:
    """A tag is a name a version number cannot be: 1-64 letters, digits, '-', '_', '.', not
    all digits."""
    return isinstance(name, str) and 0 < len(name) <= 64 and not name.isdigit() and \
        all(c.isascii() and (c.isalnum() or c in "-_.") for c in name)


def tag(store: Store, session: str, version: int | str | None, name: str) -> Manifest:
    """Name a version (a number, another name, or None: the head): retention keeps it while
    the name stays."""
    if not valid_tag(name):
        raise StoreError(f"invalid version name {name!r}: use 1-64 letters, digits, '-', '_' "
                         "or '.', not only digits", session=session)
    with store.locked(session):
        versions = log(store, session)
        if not versions:
            raise StoreError(f"session {session} has no versions", session=session)
        index = store.index(session)
        ident, manifest = resolve(store, session, version, versions, index)
        if ident in index.thinned:
            raise StoreError(f"version {manifest.version} of session {session} was thinned "
                             f"away by retention; these remain: {remaining(versions, index)}",
                             session=session, version=manifest.version)
        index.tags[name] = ident
        store.set_index(session, index)
    return manifest


def own_policy(policy: retention.RetentionPolicy, index: Index) -> retention.RetentionPolicy:
    """`policy` with what the session set for itself (`llfabric store retain`) over it."""
    return dataclasses.replace(policy, **{k: v for k, v in index.policy.items()
                                          if k in ("last", "hourly", "daily")})


def retain(store: Store, session: str, policy: retention.RetentionPolicy,
           protect: Iterable[str] = (), now: float | None = None) -> list[int]:
    """Thin the session's history by `policy` (its own, if it set one); `protect`: manifest ids
    kept whatever the policy says (what drafts and running cells build on). Returns the
    numbers of the versions thinned now."""
    return thin(store, session, policy, protect, now).numbers


@dataclass(frozen=True)
class Thinning:
    """What a retention pass did to a session, and until when it stands."""

    numbers: list[int]  # the versions thinned now
    due: float  # when the policy may thin more with no new version (`retention.due`)
    protected: frozenset[str]  # the versions kept only because they were protected


def thin(store: Store, session: str, policy: retention.RetentionPolicy,
         protect: Iterable[str] = (), now: float | None = None,
         read: list[tuple[str, Manifest]] | None = None) -> Thinning:
    """`retain`, telling also until when what it kept stands: until `due`, with no new
    version, no new name and its `protected` versions still protected, a pass again thins
    nothing. `read`: the history it read is added to it (for `mark` to read it once)."""
    now = time.time() if now is None else now
    protect = set(protect)
    with store.locked(session):
        versions = log(store, session)
        if read is not None:
            read += versions
        index = store.index(session)
        policy = own_policy(policy, index)
        named = set(index.tags.values())
        alive = [(i, m) for i, m in versions if i not in index.thinned]
        candidates = [retention.Version(m.version, float(m.cell.get("time", 0)), i in named,
                                        i in protect) for i, m in alive]
        kept = retention.keep(candidates, policy, now)
        thinned = [(i, m) for i, m in alive if m.version not in kept]
        if thinned:
            index.thinned.update((i, now) for i, _ in thinned)
            store.set_index(session, index)
    unprotected = retention.keep([dataclasses.replace(v, protected=False) for v in candidates],
                                 policy, now)
    return Thinning([m.version for _, m in thinned],
                    retention.due([v for v in candidates if v.number in kept], policy, now),
                    frozenset(i for i, m in alive if m.version in kept - unprotected))


def remove(store: Store, session: str) -> bool:
    """Forget a session and release everything its history names, for gc to free."""
    if store.head(session) is None:
        return False
    try:
        versions = [i for i, _ in log(store, session)]
    except StoreError:  # a damaged one is removed too; gc's grace frees it
        versions = []
    removed = store.remove_session(session)
    # The record only once the session is gone: a gc that still saw the session kept its data
    # and must not take a record older than its start for one it applied.
    if removed and versions:
        folder = store.root / "released"
        folder.mkdir(mode=0o700, exist_ok=True)  # closed: others pass through a user's part
        now = time.time()
        write_atomic(folder / f"{session}.{time.time_ns()}",
                     Index(thinned=dict.fromkeys(versions, now)).encode())
    return removed


@dataclass
class Verified:
    manifests: int = 0
    blobs: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list[str])
    repaired: list[str] = field(default_factory=list[str])  # blobs rewritten from a good copy
    restored: list[str] = field(default_factory=list[str])  # what repair did to heads, indexes
    held: dict[str, int] = field(default_factory=dict[str, int])  # session -> bytes it names


def verify(store: Store, repair: bool = False, sources: Iterable[Tier] = (),
           since: float | None = None) -> Verified:
    """Check every manifest's signature, every blob's hash, that every session's head and
    index read and that its history is complete (every object and chunk it names is present).
    With `repair`, rewrite corrupt blobs from a good copy (another tier, or `sources`), bring
    back unreadable heads (`restore_head`) and indexes (`rebuild_index`); a problem names what
    a corrupt blob that could not be repaired leaves broken. `since` (a time): check only what
    was written since, by the files' change times (which no one can set back): the blobs and
    manifests, and the histories of the sessions whose head or index was written since. A full
    verify that finds nothing wrong records when it began (`last_verified`)."""
    began = time.time() - 1.0  # file times lag the clock by up to a tick: a second's margin
    result = Verified()
    corrupt: dict[str, str] = {}  # blob -> what is wrong with it
    sizes: dict[str, int] = {}  # file -> its bytes, as read: each file is looked at once
    for path in store.disk.files():
        ident = path.name
        if ident.startswith(".") or (since is not None and _older(path, since)):
            continue
        result.blobs += 1
        try:  # streamed: a huge file costs no memory; a FIFO or a link is refused unread
            sizes[ident] = store.disk.size(ident) or 0
            result.bytes += sizes[ident]
            bad = store.disk.digest(ident) not in (ident, None)
            why = "is corrupt (hash mismatch)"
        except StoreError as exc:
            bad, why = True, f"is refused: {exc.message}"
        if bad:
            if repair and store.repair(ident, sources):
                result.repaired.append(ident)
            else:
                corrupt[ident] = why
    sessions = store.sessions()
    for session in sessions if repair else ():  # with the blobs repaired, what names them
        for fix in (restore_head, rebuild_index):
            with contextlib.suppress(StoreError):  # not fixed: reported below
                if done := fix(store, session):
                    result.restored.append(done)
    names: dict[str, set[str]] = {}  # session -> what its history names (up to a problem)
    histories: list[str] = []  # what is wrong with them
    for session in sessions:
        if since is not None and max(store.stamps([session])[session][3::4]) < since * 1e9:
            continue  # neither its head nor its index was written since (their change times)
        if not store.has_index(session):
            histories.append(f"session {session} has no index: its names (tags) and "
                             "retention policy are lost; `verify --repair` rebuilds it")
        names[session] = set()
        try:
            mark(store, session, names[session])
        except StoreError as exc:
            histories.append(f"session {session}: {exc.message}")
    read = set[str]().union(*names.values())  # the manifests of whole histories, checked
    manifests = str(store.root / "manifests")
    for ident in store.manifests():
        try:
            st = os.lstat(os.path.join(manifests, ident))
        except FileNotFoundError:  # removed meanwhile
            continue
        sizes[ident] = st.st_size
        if since is not None and st.st_ctime < since:
            continue
        result.manifests += 1
        if ident not in read:
            try:
                Manifest.decode(store.get_manifest(ident))
            except StoreError as exc:
                result.problems.append(exc.message)
    result.problems += histories
    for session, named in names.items():
        result.held[session] = sum(sizes[i] if i in sizes else size_of(store, i) for i in named)
    for ident, why in corrupt.items():
        users = sorted(s for s, named in names.items() if ident in named)
        result.problems.append(f"blob {ident} {why}"
                               + (", and no good copy was found to repair it" if repair else "")
                               + (f"; sessions {', '.join(users)} need it" if users else ""))
    if since is None and not result.problems:
        with contextlib.suppress(OSError, StoreError):  # a read-only store: no record, no harm
            write_atomic(store.root / VERIFIED, f"{began!r}\n".encode())
    return result


def last_verified(store: Store) -> float | None:
    """When the last full `verify` that found nothing wrong began; None if none did."""
    with contextlib.suppress(OSError, ValueError):
        return float((store.root / VERIFIED).read_text())
    return None


def _older(path: Path, since: float) -> bool:
    """Whether the file was last changed (written, renamed, touched) before `since`; a file
    gone meanwhile is not checked either."""
    try:
        return os.lstat(path).st_ctime < since
    except FileNotFoundError:
        return True


def mark(store: Store, session: str, live: set[str],
         versions: list[tuple[str, Manifest]] | None = None) -> set[str]:
    """Add to `live` every manifest of the session's history and every object, chunk and blob
    its versions that are not thinned name; raise if any of them is missing. `versions`: its
    history (`log`) as read already, from its head as it is now."""
    thinned = store.index(session).thinned
    for ident, manifest in log(store, session) if versions is None else versions:
        live.add(ident)
        if ident not in thinned:
            _mark_version(store, manifest, live)
    return live


def _mark_version(store: Store, manifest: Manifest, live: set[str]) -> None:
    """Add to `live` every object, chunk and blob a version names; raise if one is missing."""
    def blob(ident: str) -> None:
        if not store.has(ident):
            raise StoreError(f"blob {ident} is missing", blob=ident)
        live.add(ident)

    for plain in manifest.blobs():
        blob(plain)
    for group in manifest.groups:
        if group.blob not in live:
            blob(group.blob)
            for chunk in store.object_chunks(group.blob):
                blob(chunk)


def _reused(path: Path, stat: os.stat_result) -> bool:
    """Whether a save touched the file since the pass read its time: a save that began after
    the pass did found it intact and names it (a value back to a released version's)."""
    try:
        return path.lstat().st_mtime != stat.st_mtime
    except FileNotFoundError:
        return False  # gone already: removing it again is harmless


def size_of(store: Store, ident: str) -> int:
    """The bytes a blob or a manifest takes on disk (0 if it is gone)."""
    for path in (store.disk.path(ident), store.root / "manifests" / ident):
        with contextlib.suppress(FileNotFoundError):
            return path.lstat().st_size
    return 0


def released(store: Store, sessions: list[str], damaged: dict[str, str]) -> dict[str, float]:
    """What retention and removal released and gc has not freed yet: file name -> when
    (the latest time, if released more than once). A removed session's manifests too."""
    found: dict[str, float] = {}

    def release(ident: str, when: float, manifest_too: bool) -> None:
        try:
            manifest = Manifest.decode(store.get_manifest(ident))
        except StoreError:  # gone already, or damaged: grace frees it
            return
        names = [*manifest.blobs(), *(g.blob for g in manifest.groups)]
        for blob in list(names):
            with contextlib.suppress(StoreError, OSError):
                names += store.object_chunks(blob)
        for name in [*names, ident] if manifest_too else names:
            found[name] = max(found.get(name, 0.0), when)

    for session in sessions:
        if session not in damaged:
            for ident, when in store.index(session).thinned.items():
                if when:
                    release(ident, when, False)
    for record in _records(store):
        with contextlib.suppress(OSError, StoreError, ValueError, TypeError, KeyError):
            for ident, when in Index.decode(record.read_bytes()).thinned.items():
                release(ident, when, True)
    return found


def _records(store: Store) -> list[Path]:
    """The records of removed sessions (`remove`) gc has not freed yet; not one still being
    written (`write_atomic`'s temp file, which a concurrent remove renames into place)."""
    folder = store.root / "released"
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".tmp-")) \
        if folder.is_dir() else []


def _freed(store: Store, sessions: list[str], damaged: dict[str, str], done: float,
           young: float) -> None:
    """Mark what gc has just freed as such, so that the next gc does not read it again; and
    drop the temp files a crash left (a record's, a session's head or index), once older than
    the grace period."""
    for session in sessions:
        if session in damaged:
            continue
        with contextlib.suppress(StoreError), store.locked(session):
            index = store.index(session)
            if any(0 < when <= done for when in index.thinned.values()):
                index.thinned = {i: 0.0 if when <= done else when
                                 for i, when in index.thinned.items()}
                store.set_index(session, index)
    for record in _records(store):
        if record.stat().st_mtime <= done:
            record.unlink(missing_ok=True)
    for folder in [store.root / "released", *(store.root / "sessions" / s for s in sessions)]:
        _drop_leftovers(folder, young)


def _drop_leftovers(folder: Path, young: float) -> None:
    """Remove `write_atomic`'s temp files in `folder` older than `young`; a folder that is a
    link is not followed (a user's part of the store may hold one, pointing anywhere)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # not there, or a link
        return
    try:
        for entry in os.scandir(fd):
            with contextlib.suppress(FileNotFoundError):
                if entry.name.startswith(".tmp-") \
                        and entry.stat(follow_symlinks=False).st_mtime < young:
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)


def keep_damaged(store: Store, sessions: set[str], live: set[str]) -> None:
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
        live.update([*manifest.blobs(), *(g.blob for g in manifest.groups)])
        for group in manifest.groups:
            with contextlib.suppress(StoreError, OSError):
                live.update(store.object_chunks(group.blob))


@dataclass
class Collected:
    removed: int = 0
    freed: int = 0
    kept: int = 0
    kept_bytes: int = 0
    damaged: dict[str, str] = field(default_factory=dict[str, str])  # session -> why, kept whole


def gc(store: Store, grace: float = GRACE_SECONDS, saving_since: float | None = None
       ) -> Collected:
    """Remove manifests, blobs and crash leftovers that no session's history names: those older
    than `grace` seconds, and those that retention or removal released, unless touched since.
    `saving_since`: when the oldest save that may still commit began (a running cell's start);
    what was written or reused after it is kept, even if released later: that save may name it
    (a value back to what a thinned version held reuses that version's blob), and so is a
    file a save touched while the pass ran (its time read again just before removing it).
    A damaged session (its history cannot be read completely) is reported and keeps every
    version that still reads; the others are collected as usual."""
    started = time.time()
    live: set[str] = set()
    result = Collected()
    sessions = store.sessions()
    for session in sessions:
        try:
            mark(store, session, live)
        except StoreError as exc:
            result.damaged[session] = exc.message
    if result.damaged:
        keep_damaged(store, set(result.damaged), live)
    sweep(store, live, sessions, listing(store), released(store, sessions, result.damaged),
          result, started, grace, saving_since)
    return result


def listing(store: Store) -> dict[Path, os.stat_result]:
    """Every file gc may remove: blobs, manifests and what a crash left among them."""
    stats: dict[Path, os.stat_result] = {}
    for path in [*store.disk.files(), *(store.root / "manifests").iterdir()]:
        with contextlib.suppress(FileNotFoundError):  # a temp file renamed meanwhile
            stats[path] = path.lstat()  # a link a user put there: itself
    return stats


def sweep(store: Store, live: Container[str], sessions: list[str],
          stats: dict[Path, os.stat_result], freeable: dict[str, float], result: Collected,
          started: float, grace: float, saving_since: float | None) -> None:
    """gc's second half: remove, of the files in `stats`, those not `live` that are older than
    `grace` or that retention or removal released (`freeable`: what `released` says of
    `sessions`) and nothing touched since; then mark in `sessions`' indexes what was freed.
    `started`: when the pass began, before it read what is live."""
    young = started - grace
    # what was released after this may have been kept for a save: the next pass decides it
    # (file times lag the clock by up to a tick: a second's margin keeps a little more)
    settled = started if saving_since is None else min(started, saving_since - 1.0)

    def touched(path: Path, stat: os.stat_result) -> bool:
        """Written or reused since it was released (or since `saving_since`, if earlier)."""
        when = freeable.get(path.name, 0.0)
        return stat.st_mtime >= min(when, settled)

    spared: set[str] = set()  # the chunks of saves in flight
    for path, stat in stats.items():
        if stat.st_mtime >= young and path.parent.parent == store.disk.root \
                and touched(path, stat) and store.is_object(path.name):
            with contextlib.suppress(StoreError):  # a corrupt one names nothing to keep
                spared.update(store.object_chunks(path.name))
    for path, stat in stats.items():
        free = stat.st_mtime < young or not touched(path, stat)
        if path.name in live or path.name in spared or not free or _reused(path, stat):
            result.kept += 1
            result.kept_bytes += stat.st_size
        else:
            path.unlink(missing_ok=True)
            store.forget_object(path.name)
            result.removed += 1
            result.freed += stat.st_size
    _freed(store, sessions, result.damaged, settled, young)

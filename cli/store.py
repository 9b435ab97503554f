"""`llfabric store`: a store's history (log, checkout, tag, retain) and upkeep (rm, verify,
gc), working on the store's files; `rm` and `checkout` ask a server that serves the store to
do it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from fabric import users
from fabric.client import Client
from fabric.config import Config
from fabric.errors import FabricError, RemoteError, StoreError, UnknownSession
from fabric.snapshot import Manifest, Store, history
from fabric.snapshot.history import GRACE_SECONDS
from fabric.snapshot.store import Index
from fabric.snapshot.tiers import DiskTier

from .common import config, mb


def _store(path: str | None) -> Store:
    return Store(config(path).store)


def _no_session(session: str) -> UnknownSession:
    return UnknownSession(f"no session {session!r} in the store", session=session)


@click.group()
def store() -> None:
    """A store's history and upkeep: log, checkout, tag, retain, rm, verify, gc."""


_store_option = click.option("--store", "path",
                             help="Store directory (default: the configured one).")


@store.command("log")
@click.argument("session")
@_store_option
def store_log(session: str, path: str | None) -> None:
    """List SESSION's versions, newest first, with their sizes and names; a version retention
    thinned shows as such (its cell is known, its state is gone)."""
    store = _store(path)
    try:
        versions, index = history.log(store, session), store.index(session)
    except StoreError as exc:  # what still reads is listed: the user sees what repair keeps
        versions, index = history.intact(store, session), Index()
        if not versions:
            raise
        click.echo(f"session {session} is damaged ({exc.message}); its intact versions "
                   "follow (names and thinning unknown): `llfabric store verify --repair` "
                   "brings it back", err=True)
        damaged = True
    else:
        damaged = False
    if not versions:
        raise _no_session(session)
    names: dict[str, list[str]] = {}
    for name, ident in index.tags.items():
        names.setdefault(ident, []).append(name)
    for ident, m in versions:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.cell.get("time", 0)))
        size = "thinned" if ident in index.thinned else mb(history.size(m))
        tags = f"[{', '.join(sorted(names[ident]))}]  " if ident in names else ""
        click.echo(f"{m.version:>5}  {ident[:12]}  {when}  {size:>10}  "
                   f"{len(m.variables()):>4} vars  {m.cell.get('status', '-'):<5}  "
                   f"{tags}{_what(m)}")
    sys.exit(1 if damaged else 0)


def _what(manifest: Manifest) -> str:
    if "checkout" in manifest.cell:
        return f"checkout of version {manifest.cell['checkout']}"
    lines = str(manifest.cell.get("source") or "").strip().splitlines()
    unsaved = manifest.cell.get("unsaved")
    return (lines[0][:60] if lines else "") + (f"  [unsaved: {', '.join(unsaved)}]"
                                               if unsaved else "")


@store.command("checkout")
@click.argument("session")
@click.argument("version")
@_store_option
def store_checkout(session: str, version: str, path: str | None) -> None:
    """Make VERSION's state (a number or a name) SESSION's next one: the next cell runs on it.
    A server serving the store that has SESSION open checks it out (refused while it runs a
    cell, whose commit would otherwise be lost)."""
    configured = config(path)
    store = Store(configured.store)
    if _served_checkout(configured, session, version):
        if (head := store.head(session)) is None:
            raise _no_session(session)
        m = Manifest.decode(store.get_manifest(head))
    else:
        m = history.checkout(store, session, version)
    click.echo(f"session {session} is at version {m.version}, the state of version "
               f"{m.cell['checkout']} ({len(m.variables())} variables, {mb(history.size(m))})")
    if m.env:
        from fabric.auth import owner_name
        from fabric.envs import Envs, describe_differences, differences

        try:
            now = Envs(configured.env_root).get(owner_name(), m.env["name"]).packages()
        except FabricError as exc:
            click.echo(f"it ran in environment {m.env['name']}: {exc.message}", err=True)
            return
        if differ := differences(m.env["packages"], now):
            click.echo(describe_differences(differ, m.env["name"]), err=True)


def _served_checkout(configured: Config, session: str, version: str) -> bool:
    """Whether a server serving the store checked SESSION out, as one that has it open must:
    its refusal (a cell running) is raised; False where none has it open."""
    with Client(configured.address) as client:
        if not client.answers() or client.status().store != str(configured.store):
            return False
        try:
            client.checkout(session, version)
        except RemoteError as exc:
            if exc.kind != UnknownSession.kind:
                raise
            return False
    return True


@store.command("tag")
@click.argument("session")
@click.argument("version")
@click.argument("name")
@_store_option
def store_tag(session: str, version: str, name: str, path: str | None) -> None:
    """Name VERSION of SESSION: retention keeps a named version; checkout accepts the name."""
    m = history.tag(_store(path), session, version, name)
    click.echo(f"version {m.version} of session {session} is named {name}")


@store.command("retain")
@click.argument("session")
@click.option("--last", type=click.IntRange(0), help="Newest versions kept.")
@click.option("--hourly", type=click.IntRange(0), help="Hours with one version kept each.")
@click.option("--daily", type=click.IntRange(0), help="Days with one version kept each.")
@click.option("--default", "default", is_flag=True, help="Back to the configured policy.")
@_store_option
def store_retain(session: str, last: int | None, hourly: int | None, daily: int | None,
                 default: bool, path: str | None) -> None:
    """Set SESSION's own retention policy over the configured one (keep_versions,
    keep_hourly, keep_daily), and show what it is."""
    configured = config(path)
    store = Store(configured.store)
    if store.head(session) is None:
        raise _no_session(session)
    own = {k: v for k, v in (("last", last), ("hourly", hourly), ("daily", daily))
           if v is not None}
    with store.locked(session):
        index = store.index(session)
        index.policy = {} if default else {**index.policy, **own}
        store.set_index(session, index)
    kept = history.own_policy(configured.policy, index)
    click.echo(f"session {session} keeps its newest {kept.last} versions, one per hour for "
               f"{kept.hourly} hours, one per day for {kept.daily} days, and named ones")


@store.command("rm")
@click.argument("session")
@_store_option
def store_rm(session: str, path: str | None) -> None:
    """Remove SESSION from the store; gc frees what only it held. A server serving the store
    removes it (refused while the session runs a cell)."""
    configured = config(path)
    with Client(configured.address) as client:
        served = client.answers() and \
            client.status().store == str(configured.store)
        if served:
            client.remove(session)
    if not served and not history.remove(Store(configured.store), session):
        raise _no_session(session)
    click.echo(f"removed session {session}")


@store.command("verify")
@_store_option
@click.option("--repair", is_flag=True, help="Rewrite corrupt blobs from a good copy.")
@click.option("--from", "sources", multiple=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Another store to take good copies from (repeatable).")
@click.option("--since-last", is_flag=True,
              help="Check only what was written since the last full verify that found nothing "
                   "wrong (everything, if there was none).")
def store_verify(path: str | None, repair: bool, sources: tuple[Path, ...],
                 since_last: bool) -> None:
    """Check every manifest's signature, every blob's hash, every session's history (in each
    user's part of the store too). A full verify reads every byte kept; with --since-last,
    only the blobs and manifests written since the last full one that found nothing wrong,
    and the histories of the sessions written since: a quick check after a crash or a copy,
    while only a full verify finds bytes that rotted on disk."""
    problems = 0
    for part in users.stores(_store(path)):
        since = history.last_verified(part) if since_last else None
        if since_last and since is None:
            click.echo(f"{part.root}: no full verify found it whole yet: checking everything")
        result = history.verify(part, repair, [DiskTier(source / "blobs") for source in sources],
                                since)
        for ident in result.repaired:
            click.echo(f"repaired blob {ident}")
        for done in result.restored:
            click.echo(done)
        for problem in result.problems:
            click.echo(problem, err=True)
        for session, held in sorted(result.held.items(), key=lambda item: -item[1]):
            click.echo(f"session {session} holds {mb(held)}")
        written = "" if since is None else \
            f" written since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
        click.echo(f"{part.root}: {result.manifests} manifests, {result.blobs} blobs "
                   f"({mb(result.bytes)}){written}: {len(result.problems)} problems")
        problems += len(result.problems)
    sys.exit(1 if problems else 0)


@store.command("gc")
@_store_option
@click.option("--grace", type=float, default=GRACE_SECONDS, show_default=True,
              help="Keep unreferenced files younger than this many seconds (saves in flight).")
@click.option("--keep-all", is_flag=True, help="Thin no history: free only what none names.")
def store_gc(path: str | None, grace: float, keep_all: bool) -> None:
    """Thin each session's history by its retention policy, then remove what no session's
    history needs (in each user's part of the store too); safe while servers run."""
    configured = config(path)
    keep = configured.policy
    for store in users.stores(Store(configured.store)):
        for session in [] if keep_all else store.sessions():
            try:
                thinned = history.retain(store, session, keep)
            except FabricError as exc:
                click.echo(f"session {session}: {exc.message}; nothing of it thinned", err=True)
                continue
            if thinned:
                click.echo(f"session {session}: thinned {len(thinned)} versions")
        result = history.gc(store, grace)
        for session, why in result.damaged.items():
            click.echo(f"session {session} is damaged ({why}); every version of it that still "
                       "reads was kept", err=True)
        click.echo(f"removed {result.removed} files ({mb(result.freed)}), kept {result.kept} "
                   f"({mb(result.kept_bytes)})")

"""`llfabric`: serve, run, status, demo, audit, attach, kernelspec, and the store's history
and upkeep."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import click
import nbformat

from fabric import audit as fabric_audit
from fabric import config as fabric_config
from fabric.client import Client
from fabric.embedded import EmbeddedServer
from fabric.errors import FabricError
from fabric.notebook import read_notebook, run_notebook, timings_table
from fabric.protocol import as_session_name
from fabric.snapshot import Manifest
from fabric.snapshot.history import GRACE_SECONDS

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_tiny_mlp.ipynb"


def _config(store: str | None = None, bind: str | None = None, **more: object):
    try:
        return fabric_config.load().with_overrides(store=store, bind=bind, **more)
    except FabricError as exc:
        raise click.UsageError(exc.message) from exc


class _Commands(click.Group):
    """Every command's FabricError (a bad notebook, an unreachable server, a refusal) ends it
    as a click error: its message and exit status 1, no traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except FabricError as exc:
            raise click.ClickException(exc.message) from exc


@click.group(cls=_Commands)
@click.option("-v", "--verbose", is_flag=True, help="Log what the server does.")
def main(verbose: bool) -> None:
    """llfabric: notebook cells on warm workers, the GPU held only while a cell runs."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


@main.command()
@click.option("--store", help="Store directory (default ~/.local/share/llfabric).")
@click.option("--bind", help="Address to serve on (default ipc:// in the runtime dir).")
@click.option("--slots", type=int, help="Execution slots on a host without GPUs (default: cores).")
def serve(store: str | None, bind: str | None, slots: int | None) -> None:
    """Serve notebook sessions until SIGTERM or Ctrl-C."""
    from fabric import server

    logging.getLogger().setLevel(logging.INFO)
    config = _config(store, bind, slots=slots)
    click.echo(f"llfabric serving on {config.address} (store {config.store})", err=True)
    server.run(config)  # FabricError if another server holds the store or the socket


def _print_output(index: int, output: dict) -> None:
    kind = output.get("output_type")
    if kind == "stream":
        (sys.stderr if output["name"] == "stderr" else sys.stdout).write(output["text"])
    elif kind in ("execute_result", "display_data"):
        data = output.get("data", {})
        text = data.get("text/plain", "")
        others = [m for m in data if m != "text/plain"]
        click.echo(text + (f"  [{', '.join(others)}]" if others else ""))
    elif kind == "error":
        click.echo("\n".join(output.get("traceback") or
                             [f"{output['ename']}: {output['evalue']}"]), err=True)


@contextlib.contextmanager
def _server(connect: str | None, store: str | None):
    """A client of the given server, of the default one, or of an embedded one started now."""
    config = _config(store, connect)
    with Client(config.address) as client:
        if client.ping():
            yield client
            return
    if connect:
        raise click.ClickException(f"no llfabric server answers at {connect}")
    click.echo(f"starting an embedded server on {config.address}", err=True)
    with EmbeddedServer(config), Client(config.address) as client:
        yield client


def _run(notebook: Path, connect: str | None, store: str | None, think_time: float,
         output: Path | None, cwd: Path | None, allow_errors: bool, session: str | None) -> bool:
    nb = read_notebook(notebook)
    session = session or f"{as_session_name(notebook.stem, 80)}-{uuid.uuid4().hex[:8]}"
    workdir = (cwd or notebook.resolve().parent).resolve()
    with _server(connect, store) as client:
        client.call("open", session=session, cwd=str(workdir))
        run = run_notebook(client, nb, session, think_time=think_time,
                           allow_errors=allow_errors, on_output=_print_output)
        client.call("close", session=session)
    if output is not None:
        nbformat.write(nb, str(output))
    for cell in run.cells:
        if cell.failure is not None:
            click.echo(f"cell {cell.index} failed: {cell.failure.message}", err=True)
    click.echo(f"\nsession {session}\n{timings_table(run)}")
    return run.ok


@main.command()
@click.argument("notebook", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--connect", help="Server address (default: the configured one, else embedded).")
@click.option("--store", help="Store directory of an embedded server.")
@click.option("--think-time", type=float, default=0.0, show_default=True,
              help="Seconds each cell is drafted before it is executed, as an editing user.")
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the executed notebook, with its outputs, here.")
@click.option("--cwd", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Working directory of the session (default: the notebook's folder).")
@click.option("--allow-errors", is_flag=True, help="Go on after a cell that raises.")
@click.option("--session", help="Session name (default: the notebook's name and a random tag).")
def run(notebook: Path, connect: str | None, store: str | None, think_time: float,
        output: Path | None, cwd: Path | None, allow_errors: bool, session: str | None) -> None:
    """Execute NOTEBOOK's code cells in order on a fabric server."""
    ok = _run(notebook, connect, store, think_time, output, cwd, allow_errors, session)
    sys.exit(0 if ok else 1)


@main.command()
@click.argument("notebook", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--verify", is_flag=True,
              help="Also run each cell on its closure alone and compare outputs and variables.")
@click.option("--json", "json_out", type=click.Path(path_type=Path, dir_okay=False),
              help="Write every cell's audit here.")
def audit(notebook: Path, verify: bool, json_out: Path | None) -> None:
    """Check llfabric's closures on NOTEBOOK: run it here, in a copy of its folder, recording
    what each cell looks up. Exits 1 if a cell needed something outside its closure."""
    read_notebook(notebook)  # a clear error for a file that is not a notebook
    with tempfile.TemporaryDirectory(prefix="llfabric-audit-") as workdir:
        log = Path(workdir) / "audit.log"
        try:
            cells = fabric_audit.audit_notebook(notebook.resolve(), Path(workdir), verify,
                                                log=log)
        except subprocess.CalledProcessError as exc:
            raise click.ClickException(f"the audit failed:\n{log.read_text()[-4000:]}") from exc
    if json_out is not None:
        json_out.write_text(json.dumps(cells))
    click.echo(fabric_audit.report(cells))
    sys.exit(1 if any(c["misses"] or c["variable_diffs"] for c in cells) else 0)


@main.command()
@click.option("--think-time", type=float, default=2.0, show_default=True)
def demo(think_time: float) -> None:
    """Run the bundled PyTorch training notebook on the embedded default, with think time."""
    started = time.monotonic()
    ok = _run(EXAMPLE, None, None, think_time, None, None, False, None)
    click.echo(f"demo finished in {time.monotonic() - started:.1f} s")
    sys.exit(0 if ok else 1)


@main.command()
@click.option("--connect", help="Server address (default: the configured one).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw status as JSON.")
def status(connect: str | None, as_json: bool) -> None:
    """Show the server's slots, leases, zygotes, workers and sessions."""
    config = _config(None, connect)
    with Client(config.address, timeout=5) as client:  # unreachable, no key, a foreign dir
        info = client.call("status")
    info = {k: v for k, v in info.items() if k not in ("type", "msg_id")}
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    leases = info["leases"]
    click.echo(f"server pid {info['pid']} on {info['address']}, store {info['store']}")
    click.echo(f"{leases['kind']} slots {leases['slots']}: {leases['held']} held, "
               f"{leases['queued']} queued")
    for slot in leases["leases"]:
        gpu = (f" {slot['name']} {slot['uuid']}, {_mib(slot.get('memory_used', 0))}/"
               f"{_mib(slot.get('memory_total', 0))} MiB, {slot.get('utilization', 0)}% busy"
               if "uuid" in slot else "")
        held = f": {slot['session']} for {slot['held']:.1f} s" if "session" in slot else ": free"
        click.echo(f"  slot {slot['slot']}{gpu}{held}")
    for waiter in leases["queue"]:
        click.echo(f"  queued {waiter['session']} for {waiter['waiting']:.1f} s")
    for z in info["zygotes"]:
        click.echo(f"zygote {z['pid']}: {', '.join(z['modules']) or '(base)'}")
    click.echo(f"workers ({info['worker_source']}): {len(info['workers'])}")
    for t in info["templates"]:
        click.echo(f"template {', '.join(t['modules']) or '(base)'}: {t['state']}, "
                   f"{_mib(t['bytes'])} MiB, {t['restores']} restores {t['error']}".rstrip())
    for s in info["sessions"]:
        flags = "".join(f", {flag}" for flag in ("running", "pinned", "prepared") if s[flag])
        click.echo(f"session {s['session']}: version {s['version']}, {s['variables']} variables, "
                   f"{s['bytes']} bytes, {s['tier']} ({_mib(s['memory'])} MiB), "
                   f"lease {s['lease_seconds']:.1f} s{flags}")


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f}"


@main.command()
@click.argument("kernel")
@click.option("--connect", help="Server address (default: the configured one).")
@click.option("--session", help="Session name (default: named after the notebook or kernel).")
def attach(kernel: str, connect: str | None, session: str | None) -> None:
    """Attach a running Jupyter KERNEL (connection file or kernel id) to the fabric."""
    from fabric.attach.kernels import attach_running

    address = _config(None, connect).address
    name = attach_running(kernel, address, session)
    click.echo(f"kernel {kernel} now runs its cells on {address}, session {name}")


@main.group()
def kernelspec() -> None:
    """The "Python 3 (llfabric)" Jupyter kernel."""


@kernelspec.command("install")
@click.option("--name", default="llfabric", show_default=True, help="Kernelspec name.")
@click.option("--connect", help="Server address the kernel attaches to (default: configured "
              "when the kernel starts).")
@click.option("--sys-prefix", is_flag=True, help="Install into this Python's prefix, not ~.")
@click.option("--prefix", help="Install under this prefix (as jupyter kernelspec install).")
def kernelspec_install(name: str, connect: str | None, sys_prefix: bool,
                       prefix: str | None) -> None:
    """Install a kernel that attaches to the fabric when it starts."""
    from fabric.attach.kernels import install_kernelspec

    path = install_kernelspec(name, connect, user=not sys_prefix,
                              prefix=sys.prefix if sys_prefix else prefix)
    click.echo(f"installed kernelspec {name} in {path}")


@main.group()
def keys() -> None:
    """The CURVE keys of clients a tcp:// server admits (in the configured key_dir)."""


def _keys():
    from fabric.auth import Keys

    return Keys(_config().key_dir)


@keys.command("new")
@click.argument("user")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False),
              help="Where to write USER's client key (default: USER.key here).")
def keys_new(user: str, out: Path | None) -> None:
    """Admit USER: make their key pair and write the client key file they install as
    ~/.config/llfabric/client.key on their machine."""
    from fabric.auth import write_client_key

    out = out or Path(f"{user}.key")
    if out.exists() or out.is_symlink():
        raise FabricError(f"{out} exists; choose another --out")
    write_client_key(out, _keys().new_client(user))
    click.echo(f"admitted {user}; give them {out} (secret: it is their key) to install as "
               "~/.config/llfabric/client.key")


@keys.command("list")
def keys_list() -> None:
    """The admitted users and their public keys."""
    for user, public in _keys().users().items():
        click.echo(f"{user}  {public}")


@keys.command("revoke")
@click.argument("user")
def keys_revoke(user: str) -> None:
    """Stop admitting USER, also on the connections they have open."""
    if not _keys().revoke(user):
        raise click.ClickException(f"no key of user {user!r}")
    click.echo(f"revoked {user}")


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _store(path: str | None):
    from fabric.snapshot import Store

    return Store(_config(path).store)


@main.group()
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
    from fabric.snapshot import history

    store = _store(path)
    versions = history.log(store, session)
    index = store.index(session)
    if not versions:
        raise click.ClickException(f"no session {session!r} in the store")
    names: dict[str, list[str]] = {}
    for name, ident in index.tags.items():
        names.setdefault(ident, []).append(name)
    for ident, m in versions:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.cell.get("time", 0)))
        size = "thinned" if ident in index.thinned else _mb(history.size(m))
        tags = f"[{', '.join(sorted(names[ident]))}]  " if ident in names else ""
        click.echo(f"{m.version:>5}  {ident[:12]}  {when}  {size:>10}  "
                   f"{len(m.variables()):>4} vars  {m.cell.get('status', '-'):<5}  "
                   f"{tags}{_what(m)}")


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
    """Make VERSION's state (a number or a name) SESSION's next one: the next cell runs on it."""
    from fabric.snapshot import history

    m = history.checkout(_store(path), session, version)
    click.echo(f"session {session} is at version {m.version}, the state of version "
               f"{m.cell['checkout']} ({len(m.variables())} variables, {_mb(history.size(m))})")


@store.command("tag")
@click.argument("session")
@click.argument("version")
@click.argument("name")
@_store_option
def store_tag(session: str, version: str, name: str, path: str | None) -> None:
    """Name VERSION of SESSION: retention keeps a named version; checkout accepts the name."""
    from fabric.snapshot import history

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
    from fabric.snapshot import history
    from fabric.snapshot.retention import Policy

    config, store = _config(path), _store(path)
    if store.head(session) is None:
        raise click.ClickException(f"no session {session!r} in the store")
    own = {k: v for k, v in (("last", last), ("hourly", hourly), ("daily", daily))
           if v is not None}
    with store.locked(session):
        index = store.index(session)
        index.policy = {} if default else {**index.policy, **own}
        store.set_index(session, index)
    policy = history.own_policy(
        Policy(config.keep_versions, config.keep_hourly, config.keep_daily), index)
    click.echo(f"session {session} keeps its newest {policy.last} versions, one per hour for "
               f"{policy.hourly} hours, one per day for {policy.daily} days, and named ones")


@store.command("rm")
@click.argument("session")
@_store_option
def store_rm(session: str, path: str | None) -> None:
    """Remove SESSION from the store; gc frees what only it held. A server serving the store
    removes it (refused while the session runs a cell)."""
    from fabric.snapshot import history

    config = _config(path)
    with Client(config.address) as client:
        if client.ping() and client.call("status")["store"] == str(config.store):
            client.call("rm", session=session)
            click.echo(f"removed session {session}")
            return
    if not history.remove(_store(path), session):
        raise click.ClickException(f"no session {session!r} in the store")
    click.echo(f"removed session {session}")


@store.command("verify")
@_store_option
@click.option("--repair", is_flag=True, help="Rewrite corrupt blobs from a good copy.")
@click.option("--from", "sources", multiple=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Another store to take good copies from (repeatable).")
def store_verify(path: str | None, repair: bool, sources: tuple[Path, ...]) -> None:
    """Check every manifest's signature, every blob's hash, every session's history."""
    from fabric.snapshot import history
    from fabric.snapshot.tiers import DiskTier

    result = history.verify(_store(path), repair,
                            [DiskTier(source / "blobs") for source in sources])
    for ident in result.repaired:
        click.echo(f"repaired blob {ident}")
    for problem in result.problems:
        click.echo(problem, err=True)
    for session, held in sorted(result.held.items(), key=lambda item: -item[1]):
        click.echo(f"session {session} holds {_mb(held)}")
    click.echo(f"{result.manifests} manifests, {result.blobs} blobs ({_mb(result.bytes)}): "
               f"{len(result.problems)} problems")
    sys.exit(1 if result.problems else 0)


@store.command("gc")
@_store_option
@click.option("--grace", type=float, default=GRACE_SECONDS, show_default=True,
              help="Keep unreferenced files younger than this many seconds (saves in flight).")
@click.option("--keep-all", is_flag=True, help="Thin no history: free only what none names.")
def store_gc(path: str | None, grace: float, keep_all: bool) -> None:
    """Thin each session's history by its retention policy, then remove what no session's
    history needs; safe while servers run."""
    from fabric.snapshot import history
    from fabric.snapshot.retention import Policy

    config, store = _config(path), _store(path)
    policy = Policy(config.keep_versions, config.keep_hourly, config.keep_daily)
    for session in [] if keep_all else store.sessions():
        try:
            thinned = history.retain(store, session, policy)
        except FabricError as exc:
            click.echo(f"session {session}: {exc.message}; nothing of it thinned", err=True)
            continue
        if thinned:
            click.echo(f"session {session}: thinned {len(thinned)} versions")
    result = history.gc(store, grace)
    for session, why in result.damaged.items():
        click.echo(f"session {session} is damaged ({why}); every version of it that still "
                   "reads was kept", err=True)
    click.echo(f"removed {result.removed} files ({_mb(result.freed)}), kept {result.kept} "
               f"({_mb(result.kept_bytes)})")


if __name__ == "__main__":
    main()

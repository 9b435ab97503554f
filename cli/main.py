"""`llfabric`: serve, run, demo, audit, attach and kernelspec here; status, keys, store,
simulate, report and replay in their own modules. One group turns any command's FabricError into a
click error."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import tempfile
import time
import uuid
from pathlib import Path

import click

from fabric import audit as fabric_audit
from fabric.client import PATIENCE, Client
from fabric.errors import (
    ConfigError,
    Detached,
    FabricError,
    RemoteError,
    SessionBusy,
    UnknownSession,
)
from fabric.messages import Drain, Drained, Followed, Output
from fabric.protocol import as_session_name

from .common import DEMO_NEEDS, DEMO_NOTEBOOK, client_of, config
from .env import env as env_group
from .fleet import replay as replay_command
from .fleet import report as report_command
from .fleet import simulate as simulate_command
from .host import doctor as doctor_command
from .host import service as service_group
from .keys import keys as keys_group
from .status import status as status_command
from .store import store as store_group


class _Commands(click.Group):
    """Every command's FabricError ends it as a click error, with its message and no
    traceback: a configuration to fix as a usage error (exit status 2), anything else (a bad
    notebook, an unreachable server, a refusal) with exit status 1."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            raise click.UsageError(exc.message) from exc
        except FabricError as exc:
            raise click.ClickException(exc.message) from exc


@click.group(cls=_Commands)
@click.version_option(package_name="llfabric", message="llfabric %(version)s")
@click.option("-v", "--verbose", is_flag=True, help="Log what the server does.")
def main(verbose: bool) -> None:
    """llfabric: notebook cells on warm workers, the GPU held only while a cell runs."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


@main.command()
@click.option("--store", help="Store directory (default ~/.local/share/llfabric).")
@click.option("--bind", help="Address to serve on (default ipc:// in the runtime dir).")
@click.option("--slots", type=int, help="Execution slots on a host without GPUs (default: cores).")
@click.option("--remote", help="fsspec URL where every commit is kept too (a shared folder, "
                               "s3://...), and read from when this host lacks it.")
@click.option("--ray", "ray_address", metavar="ADDRESS|auto",
              help="Serve the hosts of this Ray cluster (a host agent on each of its nodes) "
                   "through one front door; needs --remote.")
def serve(store: str | None, bind: str | None, slots: int | None, remote: str | None,
          ray_address: str | None) -> None:
    """Serve notebook sessions until SIGTERM or Ctrl-C (SIGUSR1: every thread's and task's
    stack to the log, for a server that seems stuck)."""
    logging.getLogger().setLevel(logging.INFO)
    configured = config(store, bind, slots=slots, remote=remote, ray=ray_address)
    if configured.ray:
        from fabric.cluster import door

        click.echo(f"llfabric front door on {configured.address} for the Ray cluster at "
                   f"{configured.ray} (remote {configured.remote})", err=True)
        door.run(configured)
        return
    from fabric import server

    click.echo(f"llfabric serving on {configured.address} (store {configured.store})", err=True)
    server.run(configured)  # FabricError if another server holds the store or the socket


@main.command()
@click.argument("host")
@click.option("--connect", help="The cluster's front door (default: the configured address).")
@click.option("--undo", is_flag=True, help="Let HOST take sessions again.")
def drain(host: str, connect: str | None, undo: bool) -> None:
    """Move every session off HOST of a cluster, and open none there (until --undo)."""
    with Client(config(None, connect).address, timeout=600) as client:
        reply = client.ask(Drain(host, undo), Drained)
    for moved in reply.moved:
        click.echo(f"session {moved.session} -> host {moved.to}")
    click.echo(f"host {reply.host} takes sessions again" if undo else
               f"host {reply.host} is drained: {len(reply.moved)} sessions moved",
               err=True)


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


def _run(notebook: Path, connect: str | None, store: str | None, think_time: float,
         output: Path | None, cwd: Path | None, allow_errors: bool, session: str | None,
         gpus: int | None = None, env: str | None = None) -> bool:
    # here, not above: nbformat (through jsonschema) takes over a second to import, which every
    # other command, the server's start included, would pay
    import nbformat

    from fabric.notebook import (
        notebook_env,
        notebook_gpus,
        read_notebook,
        run_notebook,
        timings_table,
    )

    nb = read_notebook(notebook)
    gpus = gpus or notebook_gpus(nb)
    env = env if env is not None else notebook_env(nb)
    session = session or f"{as_session_name(notebook.stem, 80)}-{uuid.uuid4().hex[:8]}"
    workdir = (cwd or notebook.resolve().parent).resolve()
    with client_of(connect, store) as client:
        client.open(session, str(workdir), env)
        try:
            run = run_notebook(client, nb, session, think_time=think_time,
                               allow_errors=allow_errors, on_output=_print_output, gpus=gpus,
                               on_interrupt=_interrupting)
        except Detached as exc:  # the session stays open, its cell running
            click.echo(f"\n{exc.message}", err=True)
            sys.exit(130)
        try:
            client.close_session(session)
        except RemoteError as exc:
            if exc.kind != SessionBusy.kind:
                raise
            click.echo(exc.message, err=True)  # another client's cell runs in it
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
@click.option("--gpus", type=click.IntRange(min=1),
              help="GPUs (or slots) each cell leases together (default: the notebook's "
                   "metadata llfabric.gpus, else the server's gpus setting).")
@click.option("--env", help="Your environment the cells import from (default: the notebook's "
                            "metadata llfabric.env, else the server's packages).")
def run(notebook: Path, connect: str | None, store: str | None, think_time: float,
        output: Path | None, cwd: Path | None, allow_errors: bool, session: str | None,
        gpus: int | None, env: str | None) -> None:
    """Execute NOTEBOOK's code cells in order on a fabric server."""
    ok = _run(notebook, connect, store, think_time, output, cwd, allow_errors, session, gpus,
              env)
    sys.exit(0 if ok else 1)


def _interrupting(session: str) -> None:
    click.echo(f"\ninterrupting the cell of session {session}; Ctrl-C again detaches from it "
               "(it runs on)", err=True)


@main.command()
@click.argument("session")
@click.option("--connect", help="Server address (default: the configured one).")
def stop(session: str, connect: str | None) -> None:
    """Stop SESSION's running cell, whichever client ran it; its state stays at the last
    committed cell."""
    with Client(config(None, connect).address) as client:
        try:
            stopped = client.stop(session, timeout=PATIENCE)
        except RemoteError as exc:
            if exc.kind != UnknownSession.kind:
                raise
            stopped = False  # not open: nothing of it runs
    click.echo(f"stopped the cell of session {session}" if stopped else
               f"session {session} runs no cell", err=True)


@main.command()
@click.argument("session")
@click.option("--connect", help="Server address (default: the configured one).")
def follow(session: str, connect: str | None) -> None:
    """Show SESSION's running cell (one a client detached from): its outputs so far and live,
    until it ends. Exits 1 if it failed or there is none."""
    with Client(config(None, connect).address) as client:
        cell = None
        for message in client.follow(session, timeout=0):
            if isinstance(message, Output):
                _print_output(0, message.output)
            elif isinstance(message, Followed):
                cell = message.cell
    if cell is None:
        click.echo(f"session {session} runs no cell", err=True)
    sys.exit(0 if cell is not None and cell.status == "ok" else 1)


@main.command()
@click.argument("notebook", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--verify", is_flag=True,
              help="Also run each cell on its closure alone and compare outputs and variables.")
@click.option("--json", "json_out", type=click.Path(path_type=Path, dir_okay=False),
              help="Write every cell's audit here.")
def audit(notebook: Path, verify: bool, json_out: Path | None) -> None:
    """Check llfabric's closures on NOTEBOOK: run it here, in a copy of its folder, recording
    what each cell looks up. Exits 1 if a cell needed something outside its closure."""
    from fabric.notebook import read_notebook  # see _run

    read_notebook(notebook)  # a clear error for a file that is not a notebook
    with tempfile.TemporaryDirectory(prefix="llfabric-audit-") as workdir:
        cells = fabric_audit.audit_notebook(notebook.resolve(), Path(workdir), verify,
                                            log=Path(workdir) / "audit.log")
    if json_out is not None:
        json_out.write_text(json.dumps(cells))
    click.echo(fabric_audit.report(cells))
    sys.exit(1 if any(c["misses"] or c["variable_diffs"] for c in cells) else 0)


@main.command()
@click.option("--think-time", type=float, default=2.0, show_default=True,
              help="Seconds each cell is drafted before it is executed, as an editing user.")
def demo(think_time: float) -> None:
    """Run the PyTorch training notebook shipped with llfabric (it needs torch and
    matplotlib) on the embedded default server, in a scratch folder, with think time."""
    missing = [name for name in DEMO_NEEDS if importlib.util.find_spec(name) is None]
    if missing:  # the embedded server's workers import from this Python
        raise click.ClickException(f"the demo notebook needs {' and '.join(missing)}: "
                                   f"pip install {' '.join(missing)}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llfabric-demo-") as workdir:
        ok = _run(DEMO_NOTEBOOK, None, None, think_time, None, Path(workdir), False, None)
    click.echo(f"demo finished in {time.monotonic() - started:.1f} s")
    sys.exit(0 if ok else 1)


@main.command()
@click.argument("kernel")
@click.option("--connect", help="Server address (default: the configured one).")
@click.option("--session", help="Session name (default: named after the notebook or kernel).")
def attach(kernel: str, connect: str | None, session: str | None) -> None:
    """Attach a running Jupyter KERNEL (connection file or kernel id) to the fabric."""
    from fabric.attach.kernels import attach_running

    address = config(None, connect).address
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
@click.option("--env", help="Your environment its sessions import from (see `llfabric env`).")
def kernelspec_install(name: str, connect: str | None, sys_prefix: bool,
                       prefix: str | None, env: str | None) -> None:
    """Install a kernel that attaches to the fabric when it starts."""
    from fabric.attach.kernels import install_kernelspec

    path = install_kernelspec(name, connect, user=not sys_prefix,
                              prefix=sys.prefix if sys_prefix else prefix, env=env)
    click.echo(f"installed kernelspec {name} in {path}")


main.add_command(status_command)
main.add_command(keys_group)
main.add_command(env_group)
main.add_command(store_group)
main.add_command(doctor_command)
main.add_command(service_group)
main.add_command(simulate_command)
main.add_command(report_command)
main.add_command(replay_command)


if __name__ == "__main__":
    main()

"""Commands for a host's operator: `doctor` (can this host serve?) and `service install` (a
systemd unit to run the server under)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fabric import doctor as fabric_doctor
from fabric import service as fabric_service

from .common import config

VERDICTS = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


@click.command()
@click.option("--store", help="The store directory to check (default: the configured one).")
def doctor(store: str | None) -> None:
    """Check this host as an operator needs: kernel, CRIU, the NVIDIA driver and checkpoint
    API, GPUs and MIG, the store's disk and directories, the server's capabilities. Exit
    status 1 when the host cannot serve."""
    checks = fabric_doctor.run(config(store))
    width = max(len(c.name) for c in checks)
    for check in checks:
        click.echo(f"{VERDICTS[check.verdict]:<4}  {check.name:<{width}}  {check.detail}")
        if check.fix:
            click.echo(f"{'':<4}  {'':<{width}}  fix: {check.fix}")
    serves = fabric_doctor.serves(checks)
    click.echo("this host can serve" if serves else "this host cannot serve: fix the FAIL lines")
    sys.exit(0 if serves else 1)


@click.group()
def service() -> None:
    """Run the server as a system service."""


@service.command()
@click.option("--unit", "unit_path", type=click.Path(dir_okay=False, path_type=Path),
              default=fabric_service.UNIT_PATH, show_default=True,
              help="Where to write the systemd unit.")
@click.option("--store", help="Store directory (default /var/lib/llfabric).")
@click.option("--bind", help="Address to serve on (default ipc:// under /run/llfabric).")
def install(unit_path: Path, store: str | None, bind: str | None) -> None:
    """Write a systemd unit for `llfabric serve`, and say how to start it."""
    text = fabric_service.unit(fabric_service.executable(), store, bind)
    unit_path.parent.mkdir(parents=True, exist_ok=True)
    unit_path.write_text(text)
    click.echo(f"wrote {unit_path}; start it with:\n"
               f"  systemctl daemon-reload && systemctl enable --now {unit_path.stem}\n"
               f"and read its log with: journalctl -u {unit_path.stem}")

"""`llfabric status`: the server's slots, leases, zygotes, workers, templates and sessions."""

from __future__ import annotations

import json

import click

from fabric.client import Client
from fabric.status import (
    BacklogStatus,
    HostStatus,
    MemoryStatus,
    ServerStatus,
    SessionStatus,
    SlotStatus,
)

from .common import config, mib


@click.command()
@click.option("--connect", help="Server address (default: the configured one).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw status as JSON.")
def status(connect: str | None, as_json: bool) -> None:
    """Show the server's slots, leases, zygotes, workers and sessions."""
    with Client(config(None, connect).address, timeout=5) as client:  # unreachable, no key...
        info = client.status()
    if as_json:
        click.echo(json.dumps(info.to_map(), indent=2))
        return
    click.echo("\n".join(describe(info)))


def describe(info: ServerStatus) -> list[str]:
    leases = info.leases
    lines = [f"server pid {info.pid} on {info.address}, store {info.store}"]
    lines += [_host(h) for h in info.hosts]
    lines.append(f"{leases.kind} slots {leases.slots}: {leases.held} held, "
                 f"{leases.queued} queued")
    lines += [_slot(slot) for slot in leases.leases]
    lines += [f"  queued {w.session} ({w.slots} slots) for {w.waiting:.1f} s"
              for w in leases.queue]
    lines += [f"zygote {z.pid}: {', '.join(z.modules) or '(base)'}" for z in info.zygotes]
    lines.append(f"workers ({info.worker_source}): {len(info.workers)}")
    lines += [f"template {', '.join(t.modules) or '(base)'}: {t.state}, {mib(t.bytes)} MiB, "
              f"{t.restores} restores {t.error}".rstrip() for t in info.templates]
    lines += [_memory(info.memory)] if info.memory is not None else []
    lines += [_backlog(info.backlog)] if info.backlog is not None else []
    lines += [_session(s) for s in info.sessions]
    return lines


def _memory(m: MemoryStatus) -> str:
    stall = f", {m.stall_percent:.1f}% stalled" if m.stall_percent is not None else ""
    limit = f" of {mib(m.kept_memory)} MiB (kept_memory)" if m.kept_memory else ""
    user = f", {mib(m.user_memory)} MiB a user (user_memory)" if m.user_memory else ""
    evicted = "".join(f", {e.count} {e.how} for {e.why}" for e in m.evicted)
    return (f"memory ({m.source}): {m.used_percent:.0f}% in use{stall}"
            f"{', short' if m.pressure else ''}; kept workers {mib(m.kept)} MiB{limit}{user}"
            f"{evicted}")


def _backlog(b: BacklogStatus) -> str:
    failing = f"; failing ({b.failing}), next try in {b.retry_in:.0f} s" if b.failing else ""
    return (f"remote {b.remote}, filled behind: {b.versions} versions of {b.sessions} sessions "
            f"to send, {mib(b.sent_bytes)} MiB sent{failing}")


def _slot(slot: SlotStatus) -> str:
    gpu = (f" {slot.name} {slot.uuid}, {mib(slot.memory_used)}/{mib(slot.memory_total)} MiB, "
           f"{slot.utilization}% busy" if slot.uuid is not None else "")
    together = ", ".join(map(str, slot.with_slots))
    gang = f" (slots {together} together)" if len(slot.with_slots) > 1 else ""
    held = f": {slot.session}{gang} for {slot.held or 0.0:.1f} s" if slot.session else ": free"
    held += ", lingering" if slot.lingering else ""
    return f"  slot {slot.slot}{gpu}{held}"


def _host(h: HostStatus) -> str:
    state = "lost" if not h.alive else "draining" if h.draining else "up"
    return (f"host {h.name} ({h.address}): {state}, {h.slots} slots, {h.running} running, "
            f"{h.sessions} sessions")


def _session(s: SessionStatus) -> str:
    flags = "".join(f", {flag}" for flag in s.flags)
    where = f" on host {s.host}" if s.host else ""
    return (f"session {s.session}{where}: version {s.version}, {s.variables} variables, {s.bytes} "
            f"bytes, {s.tier} ({mib(s.memory)} MiB), lease {s.lease_seconds:.1f} s{flags}")

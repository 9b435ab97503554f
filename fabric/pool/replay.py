"""Rebuilding, on a fresh worker, the values a lost worker alone held (see `snapshot.lineage`).

The worker is loaded with the state the chain of cells first ran on; under the cell's lease it
runs the chain again (its outputs are told in a notice, never shown as the cell's), then settles
on the head: every saved name becomes the head's, and what the replay was for is kept only if
nothing it shares objects with came out otherwise than the first time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import LoadFailed, WorkerDied
from ..snapshot import lineage
from ..worker.messages import AskInput, CellOutput, Done, InputReply, RunCell, Settle, Settled

if TYPE_CHECKING:
    from .cells import EventSink, Head
    from .pool import WorkerHandle

REPLAY_SHOWN = 500  # characters of a replay's outputs its notice repeats


@dataclass(frozen=True)
class Recomputed:
    rebuilt: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def _text(output: dict) -> str:
    """An output as the text a notice can repeat."""
    if output.get("output_type") == "stream":
        return str(output.get("text", ""))
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}\n"
    return str((output.get("data") or {}).get("text/plain", ""))


async def _rerun(worker: WorkerHandle, replay: lineage.Replay, device: str | None,
                 threads: int, events: EventSink, printed: list[str]) -> str:
    """Run the chain again; why it did not go as the first time, or ''."""
    shown = time.monotonic()
    for cell in replay.cells:
        count = int(cell.get("execution_count") or 0)
        events.notice("progress", f"recomputing {', '.join(replay.names)}: re-running cell "
                      f"{count}")  # the client sees the cell is not stuck
        await worker.send(RunCell(str(cell.get("source", "")), count, device, threads, replay=True))
        while not isinstance(message := await worker.recv(), Done):
            if isinstance(message, CellOutput):
                printed.append(_text(message.output))
                if time.monotonic() - shown > 1:
                    events.notice("progress", f"recomputing {', '.join(replay.names)}: cell "
                                  f"{count} runs again")
                    shown = time.monotonic()
            elif isinstance(message, AskInput):
                await worker.send(InputReply(error="a replayed cell asks no one"))
        if message.status != cell.get("status", "ok"):
            return (f"cell {count} ended with {message.ename or 'an error'} this time, not as "
                    "it first did")
    return ""


async def recompute(worker: WorkerHandle, replay: lineage.Replay, head: Head, holds: set[str],
                    device: str | None, threads: int, events: EventSink) -> Recomputed:
    """Rebuild what `replay` is for on `worker`, then settle it on `head`: every name of
    `holds` is then the head's."""
    began, printed = time.monotonic(), []
    failed = await _rerun(worker, replay, device, threads, events, printed)
    manifest = head.manifest
    await worker.send(Settle([(g.blob, list(g.names)) for g in manifest.groups],
                             manifest.imports, manifest.ambient,
                             [] if failed else replay.names, sorted(holds & manifest.names())))
    settled = await worker.recv()
    if not isinstance(settled, Settled):
        raise WorkerDied(f"worker {worker.pid} answered a settle with {settled.op!r}")
    if settled.error:
        raise LoadFailed(f"could not settle on the session's state after recomputing "
                           f"{', '.join(replay.names)}: {settled.error}",
                           version=manifest.version, traceback=settled.traceback)
    lost = replay.names if failed else sorted({*settled.dropped, *settled.missing})
    if settled.dropped:
        failed = (f"running the cells again gave {', '.join(settled.diverged)}, which "
                  f"{', '.join(settled.dropped)} share objects with, other values than they "
                  "first did")
    cells = ", ".join(str(c.get("execution_count", "?")) for c in replay.cells)
    plural = "s" if len(replay.cells) > 1 else ""
    if lost:
        events.notice("lost", (
            f"the worker that held {', '.join(lost)} (which could not be saved) is gone, and "
            f"re-running cell{plural} {cells} did not rebuild them"
            f"{': ' + failed if failed else ''}; continuing from version {manifest.version} "
            "without them"), lost=True)
    rebuilt = [n for n in replay.names if n not in lost]
    if rebuilt:
        said = "".join(printed).strip()
        events.notice("recomputed", (
            f"{', '.join(rebuilt)} (which could not be saved) were rebuilt on a fresh worker by "
            f"re-running cell{plural} {cells} from version {replay.start.version} in "
            f"{time.monotonic() - began:.2f} s" + (f"; they printed: {said[:REPLAY_SHOWN]}"
                                                    if said else "")))
    return Recomputed(rebuilt, lost)

"""`llfabric replay`: a small workload run live on a real local server, then the same workload
with every session pinned, and the simulator on that workload for comparison.

A live session is a corpus notebook's code cells with training bursts between them (a cell that
keeps its slot's core busy), each cell drafted, then executed after a think time. Think times
and burst lengths are drawn from the trace's sessions, divided by `compress` and capped, so a
replay of 8 sessions takes minutes. The server has `slots` CPU slots (GPUs on a GPU host).

Pinned, live: a session takes one of `slots` tokens before its first cell and gives it back
after its last, as a pinned kernel holds its GPU; its slot-time is that span, its first cell's
delay includes the wait for a token. Each cell's reply gives its path, visible delay, queue wait,
prepare, run, save and lease time; a session's slot-time is what its close reports, its workers'
lingers included (the last one ends with the close).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypedDict

import nbformat

from fabric.client import Client
from fabric.config import GPU_LINGER, Config
from fabric.embedded import EmbeddedServer
from fabric.errors import FabricError, TraceError
from fabric.messages import Executed

from .costs import Costs
from .fleet import Fleet
from .results import Json, figures
from .sessions import ModelledCell, ModelledSession
from .simulate import simulate

BURST = ("import time as _t\n_end = _t.perf_counter() + {s:.2f}\n"
         "while _t.perf_counter() < _end:\n    pass")
# The simulator's view of this machine: CPU slots, no device memory to move; the live server's
# slots stand in for GPUs, so its workers linger as a GPU host's do, and the simulator's alike
LOCAL = {"gpu_gb": 0.0, "cuda_restore_s": 0.0, "cuda_init_s": 0.0, "session_gb": 0.05,
         "linger_s": GPU_LINGER}


@dataclass
class LiveCell:
    session: int
    kind: str  # "notebook" or "burst"
    think_s: float  # from the previous cell's reply to this one's execute, as the user waited
    status: str
    path: str
    visible_delay: float
    queue: float
    prepare: float
    run: float
    save: float
    lease: float


@dataclass(frozen=True)
class Plan:
    """One live session: its notebook (for its folder) and its (think seconds, source) cells."""

    notebook: Path
    cells: tuple[tuple[float, str, str], ...]  # (think_s, kind, source)


def plan(notebooks: list[Path], count: int, trace_sessions: list[ModelledSession], compress: float,
         max_think: float, max_burst: float, burst_every: int, seed: int = 0) -> list[Plan]:
    """`count` sessions over `notebooks` in turn, think times and bursts drawn from the trace."""
    rng = random.Random(seed)
    thinks = [c.think_s for s in trace_sessions for c in s.cells[1:]]
    bursts = [c.run_s for s in trace_sessions for c in s.cells if c.training]
    plans = []
    for i in range(count):
        path = notebooks[i % len(notebooks)]
        try:
            nb = nbformat.read(str(path), as_version=4)
        except (OSError, ValueError) as exc:
            raise TraceError(f"cannot read the notebook {path}: {exc}", path=str(path)) from exc
        cells: list[tuple[float, str, str]] = []
        for k, source in enumerate(c.source for c in nb.cells if c.cell_type == "code"):
            think = min(max_think, rng.choice(thinks) / compress)
            cells.append((think, "notebook", source))
            if (k + 1) % burst_every == 0:
                burst = min(max_burst, rng.choice(bursts) / compress)
                cells.append((min(max_think, rng.choice(thinks) / compress), "burst",
                              BURST.format(s=burst)))
        plans.append(Plan(path, tuple(cells)))
    return plans


def _session(address: str, index: int, planned: Plan, workdir: Path,
             tokens: threading.Semaphore | None, out: list[LiveCell], spans: dict,
             leased: dict) -> None:
    name = f"replay-{index}"
    folder = workdir / name
    shutil.copytree(planned.notebook.parent, folder, ignore=shutil.ignore_patterns("*.ipynb"))
    waited = 0.0
    with Client(address, timeout=600) as client:
        client.open(name, str(folder))
        if tokens is not None:
            asked = time.monotonic()
            tokens.acquire()
            waited = time.monotonic() - asked
        start = time.monotonic()
        try:
            ended = time.monotonic()
            for think, kind, source in planned.cells:
                client.draft(name, source)
                time.sleep(think)
                think = time.monotonic() - ended  # the draft's own round trip included
                reply = None
                try:
                    for message in client.execute(name, source, timeout=0):
                        if isinstance(message, Executed):
                            reply = message
                except FabricError as exc:
                    ended = time.monotonic()
                    out.append(LiveCell(index, kind, think, f"error: {exc.kind}", "-", 0, 0, 0,
                                        0, 0, 0))
                    continue
                ended = time.monotonic()
                assert reply is not None, "an execute ends with its reply or raises"
                t = reply.timings
                out.append(LiveCell(index, kind, think, reply.status, reply.path,
                                    t["visible_delay"] + waited, t["queue"] + waited,
                                    t["prepare"], t["run"], t["save"], t["lease_held"]))
                waited = 0.0
        finally:
            spans[index] = time.monotonic() - start
            if tokens is not None:
                tokens.release()
            leased[index] = client.close_session(name).lease_seconds


def run_live(plans: list[Plan], slots: int,
             pinned: bool) -> tuple[list[LiveCell], dict, dict, float]:
    """Every planned session at once on a fresh local server; (cells, spans, slot-seconds each
    session leased, wall seconds)."""
    with tempfile.TemporaryDirectory(prefix="llfabric-replay-") as tmp:
        root = Path(tmp)
        config = Config(store=root / "store", runtime_dir=root, bind=f"ipc://{tmp}/s.sock",
                        linger=int(GPU_LINGER))
        env = {**os.environ, "LLFABRIC_SLOTS": str(slots)}
        cells: list[LiveCell] = []
        spans: dict[int, float] = {}
        leased: dict[int, float] = {}
        tokens = threading.Semaphore(slots) if pinned else None
        started = time.monotonic()
        with EmbeddedServer(config, env):
            threads = [threading.Thread(target=_session, args=(config.address, i, p, root,
                                                               tokens, cells, spans, leased))
                       for i, p in enumerate(plans)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return cells, spans, leased, time.monotonic() - started


class LiveFigures(TypedDict):
    """A live run's figures, in the simulator's terms."""

    cells: int
    ok: int
    slot_seconds_held: float
    slot_seconds_busy: float
    share_under_100ms: float
    delay_p50_s: float
    delay_max_s: float
    paths: dict[str, int]  # how many cells started each way


def summary(cells: list[LiveCell], spans: dict, leased: dict, pinned: bool) -> LiveFigures:
    """The live run's figures, in the simulator's terms."""
    delays = sorted(c.visible_delay for c in cells)
    ok = [c for c in cells if c.status == "ok"]
    held = sum(spans.values()) if pinned else sum(leased.values())
    paths: dict[str, int] = {}
    for c in cells:
        paths[c.path] = paths.get(c.path, 0) + 1
    return {"cells": len(cells), "ok": len(ok), "slot_seconds_held": held,
            "slot_seconds_busy": sum(c.run for c in cells),
            "share_under_100ms": sum(d < 0.1 for d in delays) / len(delays) if delays else 0.0,
            "delay_p50_s": delays[len(delays) // 2] if delays else 0.0,
            "delay_max_s": delays[-1] if delays else 0.0, "paths": paths}


def simulated(cells: list[LiveCell], plans: list[Plan], slots: int) -> dict[str, dict]:
    """The simulator on the live workload: the same think times, the runs as measured live, one
    host of `slots` slots, the costs of this machine (no device memory)."""
    sessions = []
    for index in range(len(plans)):
        mine = [c for c in cells if c.session == index]
        sessions.append(ModelledSession(index, 0.0, tuple(
            ModelledCell(c.think_s, c.run, 1, c.kind == "burst") for c in mine)))
    sessions = [s for s in sessions if s.cells]
    costs = Costs.default().with_inputs(**LOCAL)
    out = {}
    for name, policy in (("pinned", "reservation"), ("llfabric", "llfabric")):
        fleet = Fleet(gpus_per_host=slots, spare_gpus=0, boot_s=0.0, max_hosts=1)
        figs = figures(simulate(sessions, policy, costs, fleet=fleet))
        out[name] = {"slot_seconds_held": figs["gpu_hours_held"] * 3600,
                     "share_under_100ms": figs["share_under_100ms"],
                     "delay_p50_s": figs["delay_p50_s"], "paths": figs["paths"]}
    return out


def replay(plans: list[Plan], slots: int) -> Json:
    """Live under llfabric, live pinned, and simulated: every figure, and every live cell."""
    result: Json = {"slots": slots, "sessions": len(plans),
                    "notebooks": sorted({str(p.notebook) for p in plans})}
    live_cells = {}
    for mode, pinned in (("llfabric", False), ("pinned", True)):
        cells, spans, leased, wall = run_live(plans, slots, pinned)
        live_cells[mode] = cells
        result[f"live_{mode}"] = {**summary(cells, spans, leased, pinned), "wall_s": wall}
    result["simulated"] = simulated(live_cells["llfabric"], plans, slots)
    result["cells"] = {mode: [asdict(c) for c in cells] for mode, cells in live_cells.items()}
    return result

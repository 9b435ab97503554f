"""Sessions per host: llfabric sessions against plain ipykernels in the same memory, in one run.

Every session is a notebook in the middle of its work: torch imported, an MLP of `--model-mb`
(a size drawn per session from the range), its Adam optimizer with its state, and `--data-mb` of
training data, all made by a setup cell that also takes a first training step. At each N of a
sweep, N such sessions are driven for `--phase` seconds: each thinks for a time drawn from the
production trace's sessions (`fabric.fleet.sessions`, divided by `--compress`, capped at
`--max-think`; the phase starts in the middle of everyone's first think), drafts its next cell
`--edit` seconds before it runs it, as a user editing it would, and runs the kind of cell the
trace has there: a training step (a training burst) or an evaluation that only reads (the small
cells between bursts). So most sessions think at any time, and a few run a cell.

Plain: python3 ipykernels (jupyter_client) with the same cells and think times, added one at a
time: M is the most whose memory stays within `--memory-gb` (default 1.5 GB per core: the host's
slots are its cores, and 10 M sessions' active cells need slots as M kernels' do not, so a budget
grows with the slots that serve it, as a GPU host's memory does with its GPUs). llfabric: one
`llfabric serve` with N sessions, its sweep going on past M (to 10 M, or `--max-sessions`) while
its memory stays within the budget and half the free space of the store's disk (under TMPDIR) holds
their state. Its settings make an idle session cheap: keep_warm `--keep-warm` seconds, 0 by default
(a worker idle longer is retired, its session's state in the store alone, no process; the next
cell's draft readies a worker with its closure while the user edits it), linger 0 (a cell's slot
and worker go back as soon as its state is saved), cool_after 30 (a worker holding values the store
cannot keep is dumped to disk after 30 s idle), one slot per core, and retention keep_versions 1,
keep_hourly 0, keep_daily 0 (the store holds the heads alone: the disk, not memory, grows with N).

Per N and side: host memory in use (the peak over the phase of PSS summed over the server's
process tree, or over the kernels', so pages a zygote shares with its workers count once),
sessions per GB of it, the active cells' visible delay p50 and p95 (from execute to the cell's
code running: the reply's `visible_delay` on llfabric, from the request's send to the kernel's
`started` on a plain kernel), llfabric's cells that waited for memory (started on a worker made
at execute while the server reported memory pressure) and its workers cooled (sessions seen
entering the cool tier). The last line reads `density: N sessions against M plain kernels in
the same memory (R.Rx); active cells' p95 visible delay D ms`.

`--quick` (tiny models, at most 3 sessions, short phases; the budget 2.5 times the first plain
kernel's memory unless `--memory-gb` is given) proves the bench works end to end.
Usage: python bench/density.py [--memory-gb GB] [--model-mb 50-200] [--data-mb 16] [--phase 120]
    [--compress 1] [--max-think 300] [--edit 3] [--keep-warm 0] [--max-sessions N] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from jupyter_client import BlockingKernelClient, KernelManager

from fabric.client import Client
from fabric.config import Config
from fabric.embedded import EmbeddedServer
from fabric.fleet import SessionModel, read_trace
from fabric.fleet.sessions import build_sessions
from fabric.messages import Executed, Ping, Pong

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "sensei_june_60sec.csv"
GB = 1 << 30
MB = 1 << 20
SETUP = """import torch
torch.manual_seed({seed})
width = {width}
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                            torch.nn.Linear(width, width), torch.nn.ReLU(),
                            torch.nn.Linear(width, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
data = torch.randn({rows}, width)
labels = torch.randint(0, 10, ({rows},))
losses = []
"""
TRAIN = """batch = torch.randint(0, len(data), (32,))
loss = torch.nn.functional.cross_entropy(model(data[batch]), labels[batch])
loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
losses.append(loss.item())
del loss
"""
EVALUATE = """with torch.no_grad():
    batch = torch.randint(0, len(data), (256,))
    accuracy = (model(data[batch]).argmax(1) == labels[batch]).float().mean().item()
"""
COOL_AFTER = 30
CORES = os.cpu_count() or 1  # the server's slots, one per core
GB_PER_CORE = 1.5  # the default memory budget, per slot


def setup_cell(model_mb: float, data_mb: float, seed: int) -> str:
    """The setup cell of a session whose model holds about `model_mb` MB (2 width x width
    layers of float32) and whose data `data_mb` MB; a first training step creates Adam's state."""
    width = max(16, round(math.sqrt(model_mb * MB / 8)))
    rows = max(256, round(data_mb * MB / (4 * width)))
    return SETUP.format(seed=seed, width=width, rows=rows) + TRAIN


# what a phase runs
@dataclass(frozen=True)
class Planned:
    think: float  # seconds after the previous cell ended (the first: into the phase)
    source: str


def trace_cells(trace: Path) -> list[tuple[float, bool]]:
    """(think seconds, is a training) of every cell after a first in the trace's sessions."""
    sessions = build_sessions(read_trace(trace), SessionModel())
    return [(c.think_s, c.training) for s in sessions for c in s.cells[1:]]


def plan(cells: list[tuple[float, bool]], phase: float, compress: float, max_think: float,
         seed: int) -> list[Planned]:
    """One session's cells for a phase of `phase` seconds, from `seed` (both sides get the same),
    drawn from the trace. The phase begins in the middle of a think: one drawn in proportion to
    its length (a moment taken at random more often falls in a long think), cut at random."""
    rng = random.Random(seed)
    thinks = [min(max_think, think / compress) for think, _ in cells]
    [first] = rng.choices(range(len(cells)), weights=thinks)
    out = [Planned(rng.uniform(0, thinks[first]), TRAIN if cells[first][1] else EVALUATE)]
    total = out[0].think
    while total < phase:
        drawn = rng.randrange(len(cells))
        out.append(Planned(thinks[drawn], TRAIN if cells[drawn][1] else EVALUATE))
        total += thinks[drawn]
    return out


@dataclass
class Ran:
    delay: float  # seconds from execute to the cell's code running
    cold: bool  # its worker was made at execute (llfabric)
    drafted: float  # monotonic: its draft (or its execute, with no draft)
    ended: float
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # the reply's (llfabric)
    start: str = ""  # how it started (llfabric): prepared, warm, cold or restored


# the memory the processes of a side hold
def pss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):  # ended since it was listed
            total += psutil.Process(pid).memory_full_info().pss
    return total


def tree(pid: int) -> list[int]:
    """`pid` and its descendants: a server's zygotes and workers, a kernel's children."""
    with contextlib.suppress(psutil.NoSuchProcess):  # none: it has ended
        return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    return []


class Monitor(threading.Thread):
    """Samples every `every` seconds until stopped: the PSS of `pids()`, and, given a server's
    `address`, whether it reports memory pressure and which sessions are cool."""

    def __init__(self, pids: Callable[[], list[int]], address: str | None,
                 every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pids, self.address, self.every = pids, address, every
        self.peak = 0
        self.pressured: list[float] = []  # monotonic times a sample found pressure
        self.cooled = 0  # sessions seen entering the cool tier
        self._cool: set[str] = set()
        self._done = threading.Event()
        self._failed: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.address) if self.address else contextlib.nullcontext() as client:
                while True:
                    self.peak = max(self.peak, pss(self.pids()))
                    if client is not None:
                        self._server(client)
                    if self._done.wait(self.every):
                        return
        except BaseException as exc:  # raised again where the phase ends
            self._failed = exc

    def _server(self, client: Client) -> None:
        pong = client.request(Ping(), timeout=60)
        assert isinstance(pong, Pong)
        if pong.pressure:
            self.pressured.append(time.monotonic())
        cool = {s.session for s in client.status().sessions if s.tier == "cool"}
        self.cooled += len(cool - self._cool)
        self._cool = cool

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self.join()
        if self._failed is not None:
            raise self._failed


# the two sides: each opens sessions, lists its processes and runs one session's cells
class Plain:
    """Plain python3 ipykernels, one per session."""

    name = "plain"

    def __init__(self, work: Path) -> None:
        self.work = work
        self.kernels: list[tuple[KernelManager, BlockingKernelClient]] = []

    @property
    def sessions(self) -> int:
        return len(self.kernels)

    def add(self, setup: str) -> None:
        folder = self.work / f"plain-{self.sessions}"
        folder.mkdir()
        manager = KernelManager(kernel_name="python3")
        manager.start_kernel(cwd=str(folder))
        client = manager.client()
        client.start_channels()
        self.kernels.append((manager, client))
        client.wait_for_ready(timeout=300)
        ran = self.session(self.sessions - 1).execute(setup, time.monotonic())
        if ran.error:
            raise RuntimeError(f"a plain kernel's setup cell failed: {ran.error}")

    def drop(self) -> None:
        manager, client = self.kernels.pop()
        client.stop_channels()
        manager.shutdown_kernel(now=True)

    def pids(self) -> list[int]:
        return [pid for manager, _ in self.kernels
                for pid in tree(manager.provisioner.pid)]

    def session(self, index: int) -> PlainCells:
        return PlainCells(self.kernels[index][1])

    def close(self) -> None:
        while self.kernels:
            self.drop()


class PlainCells:
    """One kernel's cells; nothing is told of a cell before it runs."""

    def __init__(self, client: BlockingKernelClient) -> None:
        self.client = client

    def draft(self, source: str) -> None:
        pass

    def execute(self, source: str, drafted: float) -> Ran:
        sent = datetime.datetime.now(datetime.UTC)
        msg_id = self.client.execute(source, allow_stdin=False)
        while (reply := self.client.get_shell_msg(timeout=600))["parent_header"].get(
                "msg_id") != msg_id:
            pass
        started = reply["metadata"]["started"]
        if not isinstance(started, datetime.datetime):
            started = datetime.datetime.fromisoformat(str(started))
        content = reply["content"]
        error = None if content["status"] == "ok" else str(content.get("ename"))
        return Ran(max(0.0, (started - sent).total_seconds()), False, drafted,
                   time.monotonic(), error)

    def __enter__(self) -> PlainCells:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Fabric:
    """One `llfabric serve` (the settings of the module's notes) and its sessions."""

    name = "llfabric"

    def __init__(self, work: Path, keep_warm: int) -> None:
        self.work, self.keep_warm = work, keep_warm
        self.config = Config(store=work / "store", runtime_dir=work, bind=f"ipc://{work}/s.sock")
        settings = {"KEEP_WARM": keep_warm, "LINGER": 0, "COOL_AFTER": COOL_AFTER,
                    "SLOTS": CORES, "KEEP_VERSIONS": 1, "KEEP_HOURLY": 0,
                    "KEEP_DAILY": 0}
        env = {**os.environ, **{f"LLFABRIC_{k}": str(v) for k, v in settings.items()}}
        self.server = EmbeddedServer(self.config, env)
        self.server.start()
        self.sessions = 0

    @property
    def address(self) -> str:
        return self.config.address

    def add(self, setup: str) -> None:
        name = f"density-{self.sessions}"
        folder = self.work / name
        folder.mkdir()
        with Client(self.address, timeout=600) as client:
            client.open(name, str(folder))
        self.sessions += 1
        with self.session(self.sessions - 1) as cells:
            cells.draft(setup)  # its worker forks from a zygote that has imported torch
            ran = cells.execute(setup, time.monotonic())
        if ran.error:
            raise RuntimeError(f"an llfabric session's setup cell failed: {ran.error}")

    def settle(self) -> None:
        """Wait until the setup cells' kept workers are retired: every session idle."""
        deadline = time.monotonic() + self.keep_warm + 300
        with Client(self.address, timeout=600) as client:
            while any(s.tier in ("hot", "warm") for s in client.status().sessions):
                if time.monotonic() > deadline:
                    raise RuntimeError("the setup cells' workers were not retired")
                time.sleep(0.5)

    def pids(self) -> list[int]:
        assert self.server.process is not None
        return tree(self.server.process.pid)

    def session(self, index: int) -> FabricCells:
        return FabricCells(Client(self.address, timeout=600), f"density-{index}")

    def close(self) -> None:
        self.server.stop()


class FabricCells:
    """One session's cells, each drafted before it runs; its own connection."""

    def __init__(self, client: Client, name: str) -> None:
        self.client, self.name = client, name

    def draft(self, source: str) -> None:
        self.client.draft(self.name, source, timeout=600)

    def execute(self, source: str, drafted: float) -> Ran:
        reply = self.client.call("execute", timeout=600, session=self.name, source=source)
        assert isinstance(reply, Executed)
        error = None if reply.status == "ok" else str(reply.ename)
        return Ran(reply.timings["visible_delay"], reply.start == "cold", drafted,
                   time.monotonic(), error, reply.timings, reply.start)

    def __enter__(self) -> FabricCells:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()


# a phase
@dataclass
class Row:
    side: str
    sessions: int
    memory: int  # bytes: the peak over the phase
    cells: list[Ran] = field(default_factory=list)
    waited: int | None = None  # cells that waited for memory (llfabric)
    cooled: int | None = None  # workers cooled (llfabric)

    def delay(self, q: float) -> float:
        """The `q` quantile of the cells' visible delays, in seconds (nearest rank)."""
        delays = sorted(c.delay for c in self.cells if c.error is None)
        if not delays:
            return math.nan
        return delays[max(0, math.ceil(q * len(delays)) - 1)]


def drive(side: Plain | Fabric, plans: list[list[Planned]], phase: float, edit: float) -> Row:
    """Run every session's planned cells (one plan each) for `phase` seconds; the memory its
    processes held meanwhile, and what each cell waited."""
    cells: list[Ran] = []
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + phase

    failures: list[BaseException] = []

    def one(index: int) -> None:
        try:
            cells_of(index)
        except BaseException as exc:  # raised again below, once every session has ended
            failures.append(exc)

    def cells_of(index: int) -> None:
        with side.session(index) as session:
            ended = start
            for planned in plans[index]:
                executing = ended + planned.think
                if executing > deadline:
                    return
                time.sleep(max(0.0, executing - edit - time.monotonic()))
                drafted = time.monotonic()
                session.draft(planned.source)
                time.sleep(max(0.0, executing - time.monotonic()))
                ran = session.execute(planned.source, drafted)
                with lock:
                    cells.append(ran)
                ended = ran.ended

    address = side.address if isinstance(side, Fabric) else None
    with Monitor(side.pids, address) as monitor:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(plans))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    row = Row(side.name, len(plans), monitor.peak, cells)
    if address:
        row.cooled = monitor.cooled
        row.waited = sum(c.cold and any(c.drafted <= t <= c.ended for t in monitor.pressured)
                         for c in cells)
    return row


# the sweep
@dataclass(frozen=True)
class Workload:
    """Every session's setup and, per N, every session's plan: the same for both sides."""

    cells: list[tuple[float, bool]]  # the trace's
    model_mb: tuple[float, float]
    data_mb: float
    phase: float
    compress: float
    max_think: float
    edit: float
    seed: int

    def model(self, index: int) -> float:
        """The size of session `index`'s model, MB."""
        return random.Random(self.seed * 1_000_003 + index).uniform(*self.model_mb)

    def setup(self, index: int) -> str:
        return setup_cell(self.model(index), self.data_mb, self.seed + index)

    def stored(self, sessions: int) -> float:
        """The bytes the first `sessions` sessions' state takes in a store: each model three
        times (the weights and Adam's two moments) and its data."""
        return sum(3 * self.model(i) + self.data_mb for i in range(sessions)) * MB

    def run(self, side: Plain | Fabric) -> Row:
        """A phase of every session `side` has open."""
        n = side.sessions
        plans = [plan(self.cells, self.phase, self.compress, self.max_think,
                      (self.seed * 1_000_003 + n) * 1_000_003 + i) for i in range(n)]
        row = drive(side, plans, self.phase, self.edit)
        print(f"  {row.side} N={n}: {row.memory / GB:.2f} GB, {len(row.cells)} cells, "
              f"p95 {row.delay(0.95) * 1000:.0f} ms", flush=True)
        return row


def sweep(upto: int) -> list[int]:
    """1, 2, 4, ... below `upto`, then `upto`."""
    return [*(1 << k for k in range(upto.bit_length()) if 1 << k < upto), upto]


def plain_sweep(work: Workload, folder: Path, budget: int | None,
                cap: int) -> tuple[list[Row], int, int]:
    """Plain kernels added one at a time until the next no longer fits in `budget` (None: 2.5
    times the first one's memory) or `cap` run, a phase at each power of two and at the last
    that fit: the rows, how many fit (M) and the budget."""
    plain = Plain(folder)
    rows: list[Row] = []
    try:
        while plain.sessions < cap:
            plain.add(work.setup(plain.sessions))
            held = pss(plain.pids())
            budget = budget or int(2.5 * held)
            print(f"  plain kernels: {plain.sessions} hold {held / GB:.2f} GB", flush=True)
            if held > budget:
                plain.drop()
                break
            if plain.sessions & (plain.sessions - 1) == 0:
                rows.append(work.run(plain))
        else:
            print(f"  the cap, not the budget, stopped the plain kernels: M is at least "
                  f"{plain.sessions}")
        if plain.sessions == 0:
            raise SystemExit(f"not one plain kernel fits in {budget / GB:.2f} GB: raise "
                             "--memory-gb")
        if rows[-1].sessions != plain.sessions:
            rows.append(work.run(plain))
        assert budget is not None
        return rows, plain.sessions, budget
    finally:
        plain.close()


def fabric_sweep(work: Workload, folder: Path, budget: int, upto: int,
                 keep_warm: int) -> list[Row]:
    """One server's sessions opened up to each point of the sweep to `upto`, a phase at each,
    until one holds more than `budget`."""
    fabric = Fabric(folder, keep_warm)
    rows: list[Row] = []
    try:
        for n in sweep(upto):
            while fabric.sessions < n:
                fabric.add(work.setup(fabric.sessions))
            fabric.settle()
            rows.append(work.run(fabric))
            if rows[-1].memory > budget:
                break
        return rows
    finally:
        fabric.close()


def table(rows: list[Row]) -> None:
    print(f"{'N':>5} {'side':<9} {'memory GB':>9} {'sessions/GB':>11} {'cells':>6} "
          f"{'p50 ms':>8} {'p95 ms':>8} {'errors':>6} {'waited':>6} {'cooled':>6}")
    for row in sorted(rows, key=lambda r: (r.sessions, r.side != "plain")):
        errors = sum(c.error is not None for c in row.cells)
        print(f"{row.sessions:>5} {row.side:<9} {row.memory / GB:>9.2f} "
              f"{row.sessions / (row.memory / GB):>11.1f} {len(row.cells):>6} "
              f"{row.delay(0.5) * 1000:>8.1f} {row.delay(0.95) * 1000:>8.1f} {errors:>6} "
              f"{'-' if row.waited is None else row.waited:>6} "
              f"{'-' if row.cooled is None else row.cooled:>6}")


def slowest(row: Row) -> None:
    """What the cells at or past the row's p95 spent before their code ran: the lease queue,
    and how long their worker took to ready (`prepare`: forked and loaded, `load` of it)."""
    p95 = row.delay(0.95)
    slow = sorted((c for c in row.cells if c.error is None and c.delay >= p95),
                  key=lambda c: -c.delay)
    print(f"N={row.sessions} {row.side}: its {len(slow)} slowest cells (ms: visible delay, "
          "lease queue, prepare, load; how each started)")
    for c in slow[:10]:
        t = c.timings
        print(f"  {c.delay * 1000:6.0f} {t.get('queue', 0) * 1000:6.0f} "
              f"{t.get('prepare', 0) * 1000:6.0f} {t.get('load', 0) * 1000:6.0f}  {c.start}")


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0")
    return value


def whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def megabytes(text: str) -> tuple[float, float]:
    """LOW-HIGH (or one size) in MB."""
    low, _, high = text.partition("-")
    try:
        sizes = float(low), float(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LOW-HIGH in MB") from None
    if not 0 < sizes[0] <= sizes[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be above 0, LOW at most HIGH")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-gb", type=positive, default=None,
                        help=f"the memory budget (default {GB_PER_CORE:g} per core: "
                        f"{GB_PER_CORE * CORES:g} here; --quick: 2.5 plain kernels)")
    parser.add_argument("--model-mb", type=megabytes, default=None,
                        help="a session's model size, MB, drawn from LOW-HIGH (default 50-200)")
    parser.add_argument("--data-mb", type=positive, default=None, help="a session's data, MB")
    parser.add_argument("--phase", type=positive, default=None, help="seconds each N is driven")
    parser.add_argument("--compress", type=positive, default=None,
                        help="the trace's think times are divided by this")
    parser.add_argument("--max-think", type=positive, default=None,
                        help="longest think time, seconds after compression")
    parser.add_argument("--edit", type=positive, default=None,
                        help="seconds between a cell's draft and its execute")
    parser.add_argument("--keep-warm", type=whole, default=None,
                        help="the server's keep_warm, seconds")
    parser.add_argument("--max-sessions", type=whole, default=None,
                        help="neither side goes past this many sessions (default: plain "
                        "kernels to the budget, llfabric to 10 M)")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="tiny models, a few sessions, short phases: the bench end to end")
    args = parser.parse_args()
    defaults = (dict(memory_gb=None, model_mb=(2.0, 4.0), data_mb=1.0, phase=3.0, compress=30.0,
                     max_think=2.0, edit=0.5, keep_warm=0, max_sessions=3) if args.quick else
                dict(memory_gb=GB_PER_CORE * CORES, model_mb=(50.0, 200.0), data_mb=16.0,
                     phase=120.0, compress=1.0, max_think=300.0, edit=3.0, keep_warm=0,
                     max_sessions=0))
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    work = Workload(trace_cells(args.trace), args.model_mb, args.data_mb, args.phase,
                    args.compress, args.max_think, args.edit, args.seed)
    budget = int(args.memory_gb * GB) if args.memory_gb else None
    with tempfile.TemporaryDirectory(prefix="llf-density-") as tmp:
        root = Path(tmp)
        (root / "plain").mkdir()
        (root / "fabric").mkdir()
        cap = args.max_sessions or 1 << 30
        print(f"plain kernels until they pass the budget, a phase of {args.phase:.0f} s at "
              "each power of two", flush=True)
        plain_rows, fitted, budget = plain_sweep(work, root / "plain", budget, cap)
        upto = args.max_sessions or 10 * fitted
        room = shutil.disk_usage(root).free / 2
        if work.stored(upto) > room:
            fitting = max((n for n in range(1, upto) if work.stored(n) <= room), default=0)
            if not fitting:
                raise SystemExit("half the free space of the store's disk holds no session's "
                                 "state (TMPDIR: another disk)")
            print(f"half the free space of the store's disk holds the state of {fitting} "
                  f"sessions: llfabric's sweep stops there, not at {upto} (TMPDIR: another disk)")
            upto = fitting
        print(f"llfabric sessions to {upto}, the budget {budget / GB:.2f} GB", flush=True)
        fabric_rows = fabric_sweep(work, root / "fabric", budget, upto, args.keep_warm)
    print(f"\nmemory budget {budget / GB:.2f} GB; models {args.model_mb[0]:g}-"
          f"{args.model_mb[1]:g} MB with Adam, data {args.data_mb:g} MB; think times from "
          f"{args.trace.name} / {args.compress:g}, at most {args.max_think:g} s; drafted "
          f"{args.edit:g} s before execute; llfabric keep_warm {args.keep_warm:g} s")
    table(plain_rows + fabric_rows)
    fits = [r for r in fabric_rows if r.memory <= budget]
    if not fits:
        raise SystemExit("llfabric held more than the budget with one session")
    best = fits[-1]
    slowest(best)
    print(f"density: {best.sessions} sessions against {fitted} plain kernels in the same memory "
          f"({best.sessions / fitted:.1f}x); active cells' p95 visible delay "
          f"{best.delay(0.95) * 1000:.0f} ms")


if __name__ == "__main__":
    main()

"""Chaos: the cluster corpus notebooks run as sessions on three hosts while faults hit the hosts
and the remote tier at random; every cell must show what a plain kernel shows, unless its user
was told it was lost, and why.

The cluster: the front door over three hosts of this machine without Ray
(`tests/support/clusters.py`'s `LocalCluster`, one slot each), each in PID, mount, UTS and
network namespaces of its own on a network the run makes, where this machine allows it (as root;
else, or with `--plain-hosts`, plain processes, saying so), the remote tier a folder behind
`tests/support/flaky_remote.py`, which turns slow or full on demand. The sessions: the
notebooks of the cluster corpus differential (`tests/corpus/test_cluster_corpus.py`), one
session each at a time, each notebook run again in a fresh session and a fresh copy of its
folder as long as faults remain; each cell drafted, then executed after a think time drawn
from the production trace's sessions (`fabric.fleet.sessions`, divided by `--compress`, at
most `--max-think`), as `llfabric run --think-time` drafts it.

The driver, seeded by `--seed`, injects `--faults` faults one after another at random moments
(`--gap` seconds apart on average), each kind as often as the others in a random order, on a
host no other fault holds (a host fault leaves at least one host serving):
  kill       the host's server and every process under it killed; the door loses it and
             starts it again
  partition  the host's links (from the door, and from the other hosts reading its blobs) cut,
             for a few seconds or until the door loses it, then healed
  pause      the host's processes stopped (SIGSTOP) for a few seconds or past the heartbeats
             that lose it, then resumed
  clock      the host's wall clock jumped by minutes to days, either way, then set right:
             Python's time.time in its processes (`tests/support/skewed`), not the machine's
  remote_slow, remote_full   every call to the remote slowed, or every write refused as
             ENOSPC, for a few seconds
  drain      the host drained (its sessions moved off), then let take sessions again
A lost host is back once the door takes it again; the next fault may hold it from then on.

A session's user runs each cell and reads its reply. A cell that fails for the fabric (its host
lost, the remote refusing its commit, its commit refused as stale) is what the user was told:
they wait until the host the error names is back, open the session again, and run the cell
again, unless the session's version moved past the cell's start (its host committed it before
it was cut off, and the door kept that commit): then the cell ran but its outputs are lost to
its user, who was told so, and the session's next cell must say that the version was kept (a
`kept` notice), else the run fails. A cell that shows state lost (`fabric.notices.loss`) is
lost with its reason, and so is the rest of its notebook run, which would read that state.
When the faults are spent, the sessions stop after their current cell; the cells run are
compared with the plain kernel's as the corpus differentials compare them
(`tests/support/notebook_compare.py`).

Prints each fault as it is injected, then the faults by kind, the cells run, those that
differed (each with its session and cell), those reported lost (with their reasons), and the
seed; the last line reads `chaos: F faults injected, C cells, D differed, L reported lost, seed
S`. Exit status 1 if a cell differed, a kept version went untold, a fault could not be
injected or undone, or the run stalled. The default run (200 faults) takes about 15 minutes on
a 2-core machine; `--quick` injects one fault of each kind, 4 s apart on average (a minute or
two).
Usage: python bench/chaos.py [--faults 200] [--seed 0] [--gap 1.5] [--compress 60]
    [--max-think 3] [--quick] [--plain-hosts] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "tests" / "support"
sys.path[:0] = [str(SUPPORT), str(ROOT / "tests" / "corpus")]
from clusters import LocalCluster  # noqa: E402
from cuts import kill, paused  # noqa: E402
from flaky_remote import Flaky  # noqa: E402
from notebook_compare import (  # noqa: E402
    VOLATILE_CELLS,
    compare,
    fresh_copy,
    nb_id,
    notebook_env,
    plain_run,
)
from test_cluster_corpus import NOTEBOOKS  # noqa: E402

from fabric.errors import FabricError, RemoteError  # noqa: E402
from fabric.fleet import SessionModel, read_trace  # noqa: E402
from fabric.fleet.sessions import build_sessions  # noqa: E402
from fabric.notebook import CellRun, run_notebook  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "sensei_june_60sec.csv"
KINDS = ("kill", "partition", "pause", "clock", "remote_slow", "remote_full", "drain")
OUT = {"kill", "partition", "pause", "drain"}  # kinds that take a host from serving
HOSTS = 3
SKEW = "clock-skew"  # the file, beside each host's store, its clock's jump is written to
BACK_WITHIN = 300.0  # seconds a faulted host may take to be back (started again on a loaded box)
STALL = 900.0  # seconds a cell may go on before the run is called stalled
TRIES = 8  # runs of one cell the fabric fails before its user gives up on it
STATE_LOST = "state lost"  # a cell's notice: a value it needs neither saved nor held
KEPT = "committed, outputs cut off"  # a cell whose host committed it, then was lost


def trace_thinks(trace: Path, compress: float, max_think: float) -> list[float]:
    """The think times before every cell after a first in the trace's sessions, compressed."""
    sessions = build_sessions(read_trace(trace), SessionModel())
    return [min(max_think, c.think_s / compress) for s in sessions for c in s.cells[1:]]


class Door:
    """The door, as one thread asks it, on a client of its own that the thread closes (a client
    left to the garbage collector can hang whichever thread collects it: its ZeroMQ context
    waits for sockets not yet finalized)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.client = cluster.client(timeout=300)

    def __enter__(self) -> Door:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def alive(self) -> dict[str, bool]:
        return {h.name: h.alive for h in self.client.status().hosts}

    def until(self, what: str, done: Callable[[], bool], within: float = BACK_WITHIN) -> None:
        deadline = time.monotonic() + within
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"never: {what}")
            time.sleep(0.25)

    def back(self, host: str) -> None:
        """Wait until the door serves `host` again."""
        self.until(f"host {host} is back", lambda: self.alive().get(host, False))

    def lost(self, host: str) -> None:
        """Wait until the door has lost `host`."""
        self.until(f"the door loses host {host}", lambda: not self.alive().get(host, True))


@dataclass
class Fault:
    kind: str
    host: str | None  # None: the remote
    hold: float  # seconds the fault lasts (after the door lost the host, for a long one)
    long: bool = False  # a partition or pause held until the door loses the host
    size: float = 0.0  # the clock's jump in seconds, the remote's latency

    def __str__(self) -> str:
        what = {"clock": f" {self.size:+.0f} s", "remote_slow": f" {self.size:.2f} s a call"}
        held = "" if self.kind == "kill" else \
            f", {'until lost, then ' if self.long else ''}{self.hold:.1f} s"
        return f"{self.kind}{f' {self.host}' if self.host else ''}{what.get(self.kind, '')}{held}"


class Driver:
    """Injects `faults` faults drawn from `rng`, one host fault per host at a time and at most
    HOSTS - 1 hosts out of service at once."""

    def __init__(self, cluster: LocalCluster, flaky: Flaky, hosts: list[str], faults: int,
                 gap: float, rng: random.Random, log: Callable[[str], None]) -> None:
        self.cluster, self.flaky, self.hosts = cluster, flaky, hosts
        self.faults, self.gap, self.rng, self.log = faults, gap, rng, log
        self.injected: Counter[str] = Counter()
        self.errors: list[str] = []
        self.busy: dict[str, str] = {}  # host (or "remote") -> the kind holding it
        self.lock = threading.Condition()
        self.done = threading.Event()
        self.threads: list[threading.Thread] = []

    def run(self) -> None:
        deck: list[str] = []
        try:
            while sum(self.injected.values()) < self.faults and not self.errors:
                time.sleep(self.rng.expovariate(1 / self.gap))
                if not deck:
                    deck = list(KINDS)
                    self.rng.shuffle(deck)
                fault = self._draw(deck.pop())
                thread = threading.Thread(target=self._guarded, args=(fault,), daemon=True)
                thread.start()
                self.threads.append(thread)
                self.injected[fault.kind] += 1
            for thread in self.threads:
                thread.join()
        finally:
            self.done.set()

    def _draw(self, kind: str) -> Fault:
        """The fault, its target claimed (waiting until one is free), its size drawn."""
        rng = self.rng
        with self.lock:
            if kind.startswith("remote"):
                self.lock.wait_for(lambda: "remote" not in self.busy)
                host = None
            else:
                def free() -> list[str]:
                    out = sum(1 for k in self.busy.values() if k in OUT)
                    if kind in OUT and out >= len(self.hosts) - 1:
                        return []
                    return [h for h in self.hosts if h not in self.busy]
                self.lock.wait_for(lambda: bool(free()))
                host = rng.choice(free())
            self.busy[host or "remote"] = kind
        long = kind in ("partition", "pause") and rng.random() < 0.5
        size = {"clock": rng.choice((-1, 1)) * 10 ** rng.uniform(1.8, 5.3),
                "remote_slow": rng.uniform(0.02, 0.3)}.get(kind, 0.0)
        return Fault(kind, host, rng.uniform(0.5, 3.0) if kind != "clock" else
                     rng.uniform(2, 8), long, size)

    def _guarded(self, fault: Fault) -> None:
        self.log(str(fault))
        try:
            with Door(self.cluster) as door:
                getattr(self, f"_{fault.kind}")(fault, door)
        except Exception as exc:  # the run fails on it, not a thread's traceback
            self.errors.append(f"{fault}: {type(exc).__name__}: {exc}")
        finally:
            with self.lock:
                del self.busy[fault.host or "remote"]
                self.lock.notify_all()

    # the faults
    def _kill(self, fault: Fault, door: Door) -> None:
        host = fault.host
        assert host is not None
        pid = self.cluster.pid(host)
        kill(pid)
        door.until(f"host {host} started again",
                   lambda: self.cluster.pid(host) != pid and door.alive()[host])

    def _partition(self, fault: Fault, door: Door) -> None:
        host = fault.host
        assert host is not None
        self.cluster.cut(host)
        try:
            if fault.long:
                door.lost(host)
            time.sleep(fault.hold)
        finally:
            self.cluster.heal(host)
        door.back(host)

    def _pause(self, fault: Fault, door: Door) -> None:
        host = fault.host
        assert host is not None
        with paused(self.cluster.pid(host)):
            if fault.long:
                door.lost(host)
            time.sleep(fault.hold)
        door.back(host)

    def _clock(self, fault: Fault, door: Door) -> None:
        assert fault.host is not None
        skew = self.cluster.store(fault.host).parent / SKEW
        skew.write_text(str(fault.size))
        try:
            time.sleep(fault.hold)
        finally:
            skew.write_text("0")

    def _remote_slow(self, fault: Fault, door: Door) -> None:
        self.flaky.set(latency=fault.size)
        time.sleep(fault.hold)
        self.flaky.set()

    def _remote_full(self, fault: Fault, door: Door) -> None:
        self.flaky.set(capacity=0)
        time.sleep(fault.hold)
        self.flaky.set()

    def _drain(self, fault: Fault, door: Door) -> None:
        host = fault.host
        drained: list[BaseException] = []

        def drain() -> None:  # it answers once the host's sessions moved off
            try:
                with self.cluster.client(timeout=300) as client:
                    client.call("drain", host=host)
            except FabricError as exc:
                drained.append(exc)

        thread = threading.Thread(target=drain, daemon=True)
        thread.start()
        time.sleep(fault.hold)
        door.client.call("drain", host=host, undo=True)
        thread.join(BACK_WITHIN)
        if drained:
            self.log(f"drain {host}: {drained[0]}")


@dataclass
class Cell:
    """One cell of a notebook run: what its user saw, or why they were told it was lost."""

    source: str
    outputs: list = field(default_factory=list)
    lost: str | None = None  # why, as its user was told
    lost_as: str = ""  # the kind of loss, for the tally
    told: list[str] = field(default_factory=list)  # the failures its runs were told
    kept: list[str] = field(default_factory=list)  # its notices of a version kept for it

    def lose(self, kind: str, why: str) -> Cell:
        self.lost_as, self.lost = kind, why
        return self


class User:
    """Runs its notebook again and again, each time in a fresh session, until `stop`."""

    def __init__(self, cluster: LocalCluster, notebook: Path, work: Path, thinks: list[float],
                 rng: random.Random, stop: threading.Event) -> None:
        self.cluster, self.notebook, self.work = cluster, notebook, work
        self.thinks, self.rng, self.stop = thinks, rng, stop
        self.runs: list[tuple[str, list[Cell]]] = []  # (session, its cells)
        self.started: float | None = None  # monotonic: the cell running now began
        self.where = ""  # the session and cell running now
        self.error: str | None = None
        self.unsaid: list[str] = []  # versions kept, without their session's next cell saying so

    def run(self) -> None:
        try:
            with Door(self.cluster) as self.door:
                round_ = 0
                while not self.stop.is_set():
                    session = f"{self.notebook.stem[:24]}-{round_}"
                    self.runs.append((session, self._notebook(session)))
                    round_ += 1
        except Exception as exc:  # the run fails on it, not a thread's traceback
            self.error = f"{self.where}: {type(exc).__name__}: {exc}"

    def _notebook(self, session: str) -> list[Cell]:
        cwd = self.work / session
        copy = fresh_copy(self.notebook, cwd)
        sources = [c.source for c in nbformat.read(copy, as_version=4).cells
                   if c.cell_type == "code"]
        version = self._open(session, cwd)
        cells: list[Cell] = []
        for index, source in enumerate(sources):
            if self.stop.is_set():
                break
            self.where, self.started = f"session {session} code cell {index}", time.monotonic()
            cell, version = self._cell(session, cwd, source, version)
            if cells and cells[-1].lost_as == KEPT and not cell.kept:
                self.unsaid.append(f"session {session} code cell {index - 1}: "
                                   f"{cells[-1].lost}; code cell {index} was not told")
            cells.append(cell)
            if cell.lost_as == STATE_LOST:
                cells += [Cell(s).lose("after state lost", f"after cell {index}'s: {cell.lost}")
                          for s in sources[index + 1:]]
                break
        self.started = None
        with contextlib.suppress(FabricError):
            self.door.client.close_session(session)
        return cells

    def _open(self, session: str, cwd: Path) -> int:
        """Open (or open again) `session`: its version."""
        for attempt in range(TRIES):
            try:
                return self.door.client.open(session, str(cwd)).version
            except RemoteError as exc:
                self._settle(exc, attempt)
        raise TimeoutError(f"session {session} never opened")

    def _cell(self, session: str, cwd: Path, source: str, version: int) -> tuple[Cell, int]:
        """Run the cell until it runs, or its version is kept without it; the cell, and the
        session's version after it."""
        cell = Cell(source)
        think = self.rng.choice(self.thinks)
        for attempt in range(TRIES):
            one = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
            try:
                [ran] = run_notebook(self.door.client, one, session, allow_errors=True,
                                     think_time=think if attempt == 0 else 0.0).cells
            except RemoteError as exc:  # its draft
                ran = CellRun(0, failure=exc)
            cell.kept += [n.text for n in ran.notices if n.topic == "kept"]
            if ran.failure is None and ran.reply is not None:
                cell.outputs = one.cells[0].outputs
                lost = [n.text for n in ran.notices if n.topic == "lost"]
                if ran.lost:
                    cell.lose(STATE_LOST, lost[0])
                return cell, ran.reply.version
            failure = ran.failure
            assert failure is not None
            cell.told.append(f"{failure.kind}: {failure.message}")
            self._settle(failure, attempt)
            now = self._open(session, cwd)
            if now > version:
                return cell.lose(KEPT,
                                 f"version {now} committed where it ran: {cell.told[-1]}"), now
        return cell.lose(f"failed {TRIES} times", cell.told[-1]), version

    def _settle(self, failure: RemoteError, attempt: int) -> None:
        """Wait as the failure's user would: until the host it names is back, else a while."""
        host = failure.fields.get("host")
        if failure.kind == "host_lost" and isinstance(host, str):
            self.door.back(host)
        else:
            time.sleep(min(8.0, 0.5 * 2 ** attempt))


def compared(plain: nbformat.NotebookNode, notebook: Path, cells: list[Cell]) -> list[str]:
    """The differences of the cells run from the plain kernel's (a lost cell shows the plain
    kernel's outputs: it is counted lost, not compared)."""
    plain_cells = [c for c in plain.cells if c.cell_type == "code"][:len(cells)]
    ran = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(c.source, outputs=p.outputs if c.lost else c.outputs)
        for c, p in zip(cells, plain_cells, strict=True)])
    cut = nbformat.v4.new_notebook(cells=plain_cells)
    return compare(cut, ran, VOLATILE_CELLS.get(nb_id(notebook), {}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int,
                        help="faults to inject (default 200; --quick: one of each kind)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gap", type=float,
                        help="mean seconds between two faults' starts (default 1.5; --quick: "
                        "4, the sessions running cells between them)")
    parser.add_argument("--compress", type=float, default=60.0,
                        help="the trace's think times are divided by this")
    parser.add_argument("--max-think", type=float, default=3.0)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--quick", action="store_true",
                        help="one fault of each kind (unless --faults says)")
    parser.add_argument("--plain-hosts", action="store_true",
                        help="hosts as plain processes of this machine, not in namespaces")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    args = parser.parse_args()
    if args.faults is None:
        args.faults = len(KINDS) if args.quick else 200
    if args.gap is None:
        args.gap = 4.0 if args.quick else 1.5
    for name in ("faults", "gap", "compress", "max_think"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be above 0")
    if not args.trace.is_file():
        parser.error(f"--trace {args.trace}: no such file")

    work = Path(tempfile.mkdtemp(prefix="llf-chaos-"))
    flaky = Flaky(work / "remote")
    # the hosts' servers, zygotes and workers: the notebooks' environment, this checkout, the
    # flaky remote, and a clock each that jumps
    env = flaky.env(notebook_env())
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(SUPPORT / "skewed"),
                                         env["PYTHONPATH"]])
    os.environ.update(env, CLOCK_SKEW=SKEW)
    thinks = trace_thinks(args.trace, args.compress, args.max_think)
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"{time.monotonic() - started:7.1f}s {line}", flush=True)

    plains: dict[Path, nbformat.NotebookNode] = {}

    def run_plain() -> None:  # meanwhile: the cells are compared once the faults are spent
        for notebook in NOTEBOOKS:
            plains[notebook] = plain_run(notebook, work / "plain" / notebook.stem)
        log(f"the plain kernels ran the {len(plains)} notebooks")

    plain = threading.Thread(target=run_plain, daemon=True)
    plain.start()
    try:
        with LocalCluster(work / "cluster", HOSTS, remote=flaky.url,
                          namespaced=not args.plain_hosts) as cluster:
            log("every host up, " + ("in namespaces of its own" if cluster.network
                                     else "a plain process"))
            driver, users, stalled = chaos(cluster, flaky, work, thinks, args, log)
            log("faults spent, the sessions stopped")
        plain.join()
        if len(plains) < len(NOTEBOOKS):
            raise RuntimeError("the plain kernels did not run every notebook")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report = summary(driver, users, stalled, plains, args)
    print(report.text)
    print(f"chaos: {sum(report.injected.values())} faults injected, {report.cells} cells, "
          f"{report.differed} differed, {report.lost} reported lost, seed {args.seed}")
    return 1 if report.differed or report.failed else 0


@dataclass
class Report:
    injected: Counter[str]
    cells: int
    differed: int
    lost: int
    failed: bool
    text: str


def chaos(cluster: LocalCluster, flaky: Flaky, work: Path, thinks: list[float],
          args: argparse.Namespace, log: Callable[[str], None]
          ) -> tuple[Driver, list[User], str | None]:
    """The users and the driver, until the faults are spent; the cell running past `STALL`,
    if one did."""
    with Door(cluster) as door:
        hosts = sorted(door.alive())
    rng = random.Random(args.seed)
    driver = Driver(cluster, flaky, hosts, args.faults, args.gap, random.Random(rng.random()), log)
    users = [User(cluster, notebook, work / "fabric", thinks, random.Random(rng.random()),
                  driver.done) for notebook in NOTEBOOKS]
    threads = [threading.Thread(target=u.run, daemon=True) for u in users]
    for thread in threads:
        thread.start()
    driver_thread = threading.Thread(target=driver.run, daemon=True)
    driver_thread.start()
    stalled = None
    while any(t.is_alive() for t in threads) and stalled is None:
        time.sleep(1)
        now = time.monotonic()
        stalled = next((u.where for u in users
                        if u.started is not None and now - u.started > STALL), None)
    if stalled is not None:
        faulthandler.dump_traceback(all_threads=True)
        driver.done.set()
    driver_thread.join(BACK_WITHIN if stalled is None else 1)
    return driver, users, stalled


def summary(driver: Driver, users: list[User], stalled: str | None,
            plains: dict[Path, nbformat.NotebookNode], args: argparse.Namespace) -> Report:
    """The faults, and the cells compared with the plain kernel's."""
    out = [f"{HOSTS} hosts, {len(users)} sessions at a time, think times from "
           f"{args.trace.name} / {args.compress:g}, at most {args.max_think:g} s",
           "faults injected by kind:"]
    out += [f"  {kind:<12} {driver.injected[kind]:>4}" for kind in KINDS]
    cells = differed = lost = reran = 0
    reasons: Counter[str] = Counter()
    for user in users:
        for session, run in user.runs:
            diffs = compared(plains[user.notebook], user.notebook, run)
            cells += len(run)
            differed += len(diffs)
            out += [f"DIFFERS: {nb_id(user.notebook)} session {session} {d}" for d in diffs]
            for index, cell in enumerate(run):
                reran += bool(cell.told) and not cell.lost
                if cell.lost:
                    lost += 1
                    reasons[cell.lost_as] += 1
                    out.append(f"lost: session {session} code cell {index}: {cell.lost}")
    out.append(f"cells: {cells} run, {differed} differed, {lost} reported lost, {reran} run "
               "again after a failure their user was told of")
    out += [f"  lost as {why}: {n}" for why, n in reasons.most_common()]
    failures = driver.errors + [u.error for u in users if u.error]
    failures += [f"kept silently: {unsaid}" for u in users for unsaid in u.unsaid]
    if stalled is not None:
        failures.append(f"stalled: {stalled} ran past {STALL:.0f} s")
    out += [f"FAILED: {f}" for f in failures]
    return Report(driver.injected, cells, differed, lost, bool(failures), "\n".join(out))


if __name__ == "__main__":
    sys.exit(main())

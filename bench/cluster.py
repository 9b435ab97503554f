"""Many hosts on Ray: where a session's state comes from, and what locality placement is worth.

Both tables run on a Ray cluster of this machine's processes (ray.cluster_utils: a head and two
nodes declaring `llfabric_slots`, CPU slots standing in for GPUs: 2 + 1 + 1), under the front
door (`llfabric serve --ray`), sessions moving between hosts through a remote tier in a local
folder (file://). Every host first runs the notebooks' imports once, so no table pays for
building a zygote.

restore by tier: a fresh session builds x, a numpy array of S MiB (`--sizes`); then the wall
time at the client of a tiny cell reading it (`x[0]`), and the worker's own load seconds (its
reply's timings), when x comes from
  memory   the session's warm worker, kept on its host: the next cell
  disk     the host's store: the session closed and opened again, placed back on that host by
           locality, a fresh worker loading x from the host's disk
  peer     another host's disk: the session drained off its host (`drain`) onto one that never
           held it, which fetches x from the first (a peer) and loads it
  remote   the remote tier: both hosts that held x forget it (their blob files removed), and the
           session is drained onto the third host, which fetches x from the remote
  carried  a session whose worker alone holds g, a generator over x (no store can keep it),
           drained off its host: the worker is dumped, its image fetched by the new host from
           the old one (a peer), and the next cell (next(g)) wakes it from that image; the
           drain's own time and the image's size are printed below the table
against cold: x built again from scratch in a fresh session (the cells that made x, then x[0],
each committed as every cell is). Ratio: cold / tier. Before the disk, peer and remote
cells the files read are dropped from the page cache, so they read the disk as a host that had not
just written them would. Medians of `--repeat` fresh sessions.

12 sessions: twelve notebooks replayed at once, one thread and one client each, each cell
drafted and then executed after a think time drawn from a seeded random (0.3-1.5 s), as
`llfabric run --think-time` does; under placement = locality and then = random (the baseline),
each policy on a fresh cluster, with the same seed and notebooks. Two workloads, in turn:
  corpus     two each of six small notebooks of the corpus (numpy, pandas, matplotlib; their
             first `--cells` code cells): real cells, whose state is a few KB
  generated  notebooks whose first cell builds `--state-mb` MiB of data and whose others read
             it, and now and then change it: a fresh worker has that much to load
Visible delay of a cell: the client's wall time from sending execute to its reply, less the
cell's own run time (its reply's timings "run"); lease-seconds: the slot-seconds the cells held
(the sum of their replies' timings "lease_held": the door's status counts only the host each
session is open on at the end, printed below the table). Prints p50, p99, lease-seconds and host
moves per policy, and random / locality.

Figures on a 2-core machine running three hosts, a door and Ray are noisy; ratios are measured
in the same run. The default run takes about 6 minutes on 2 cores, --quick about 2. Usage:
  PYTHONPATH=. .venv/bin/python bench/cluster.py [--quick] [--only restore|sessions]
      [--sizes 64,256] [--repeat 3] [--sessions 12] [--cells 20] [--think 0.3,1.5]
      [--workload corpus|generated|both] [--state-mb 16] [--seed 0] [--no-drafts] [--verbose]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))
from clusters import host_of  # noqa: E402
from helpers import RunningServer, execute, serving, wait_until  # noqa: E402
from notebook_compare import notebook_env  # noqa: E402

from fabric.client import Client  # noqa: E402
from fabric.errors import FabricError  # noqa: E402
from fabric.notebook import read_notebook  # noqa: E402

CORPUS = ROOT.parent / "shared" / "corpus" / "notebooks"
if not CORPUS.is_dir():  # the shared checkout sits beside the repo or inside it
    CORPUS = ROOT / "shared" / "corpus" / "notebooks"
# Quick notebooks that need numpy, pandas, matplotlib and files beside them, nothing downloaded
NOTEBOOKS = ("PythonDataScienceHandbook/02.02-The-Basics-Of-NumPy-Arrays",
             "PythonDataScienceHandbook/03.01-Introducing-Pandas-Objects",
             "PythonDataScienceHandbook/03.02-Data-Indexing-and-Selection",
             "PythonDataScienceHandbook/03.05-Hierarchical-Indexing",
             "PythonDataScienceHandbook/03.07-Merge-and-Join",
             "PythonDataScienceHandbook/02.08-Sorting")
# what the notebooks import, run once on every host before measuring
WARM_UP = "import numpy, pandas, matplotlib.pyplot"
SLOTS = (2, 1, 1)  # the head's, then each node's
MIB = 1 << 20
VERBOSE = False  # --verbose: every measured cell's reply timings, on stderr


# the cluster
@contextlib.contextmanager
def ray_cluster(slots: tuple[int, ...]) -> Iterator[object]:
    from ray.cluster_utils import Cluster

    logging.getLogger("ray").setLevel(logging.WARNING)  # not its notes on each new cluster

    def node(n: int) -> dict:
        return {"num_cpus": n, "resources": {"llfabric_slots": n},
                "object_store_memory": 80 << 20}

    cluster = Cluster(initialize_head=True, head_node_args=node(slots[0]))
    try:
        for n in slots[1:]:
            cluster.add_node(**node(n))
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


@dataclass
class Door:
    """The front door of one fresh cluster, with its folders."""

    server: RunningServer
    work: Path  # the door's store (the hosts' stores under hosts/NAME/store) and the remote

    @property
    def remote(self) -> Path:
        return self.work / "remote"

    def host_store(self, host: str) -> Path:
        return self.work / "door" / "hosts" / host / "store"

    def client(self) -> Client:
        return Client(self.server.address, timeout=300)


@contextlib.contextmanager
def door(placement: str, work: Path) -> Iterator[Door]:
    """A fresh Ray cluster and its door placing by `placement`; every host warmed up."""
    work.mkdir(parents=True, exist_ok=True)
    with ray_cluster(SLOTS) as cluster, \
            serving(work / "door", ray=cluster.address, remote=f"file://{work}/remote",
                    placement=placement) as server:
        running = Door(server, work)
        with running.client() as client:
            wait_until(lambda: len(client.status().hosts) == len(SLOTS),
                       "every host joined", timeout=180)
            warm_up(client, work)
        yield running


def hosts_of(client: Client) -> list[str]:
    return sorted(h.name for h in client.status().hosts if h.alive)


@contextlib.contextmanager
def only_on(client: Client, host: str) -> Iterator[None]:
    """Every other host drained: sessions open, and cells run, on `host` whatever the policy."""
    others = [h for h in hosts_of(client) if h != host]
    for other in others:
        client.call("drain", host=other)
    try:
        yield
    finally:
        for other in others:
            client.call("drain", host=other, undo=True)


def warm_up(client: Client, work: Path) -> None:
    """Each host runs the notebooks' imports, so that their zygotes are built before any cell
    is measured (on any policy: the other hosts are drained meanwhile)."""
    for host in hosts_of(client):
        with only_on(client, host):
            name = f"warm-{host}"
            client.call("open", session=name, cwd=str(work))
            reply, _ = execute(client, name, WARM_UP)
            assert reply["host"] == host, reply
            client.remove(name)


def evict(root: Path) -> None:
    """Drop `root`'s files from the page cache, so the next read comes from the disk."""
    for path in (p for p in root.rglob("*") if p.is_file()):
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def forget_blobs(store: Path) -> None:
    """Remove every blob from a host's store (the bench's sessions only are there)."""
    for path in (store / "blobs").rglob("*"):
        if path.is_file():
            path.unlink()


def timed_cell(client: Client, session: str, source: str) -> tuple[float, dict]:
    """The client's wall time of one cell, and its reply."""
    start = time.perf_counter()
    reply, _ = execute(client, session, source)
    wall = time.perf_counter() - start
    if reply.get("status") != "ok":
        raise FabricError(f"cell {source!r} of {session} ended {reply.get('status')}: "
                          f"{reply.get('ename')}")
    return wall, reply


# table 1: restore by tier
TIERS = ("cold", "memory", "disk", "peer", "remote", "carried")


@dataclass
class Restore:
    """One tier's measurements: the client's wall time and the reply's timings, per cell."""

    wall: list[float] = field(default_factory=list)
    timings: list[dict] = field(default_factory=list)
    paths: set[str] = field(default_factory=set)
    moves: list[float] = field(default_factory=list)  # carried: the drain's wall time
    images: list[int] = field(default_factory=list)  # carried: the image's bytes

    def add(self, wall: float, reply: dict) -> None:
        self.wall.append(wall)
        self.timings.append(reply.get("timings", {}))
        self.paths.add(reply.get("path", "?"))

    def median(self, key: str) -> float:
        return statistics.median(t.get(key, 0.0) for t in self.timings)


def restore_round(running: Door, client: Client, size: int, rep: int,
                  out: dict[str, Restore]) -> None:
    """One fresh session through every tier, into `out`."""
    name = f"restore-{size >> 20}-{rep}"
    cwd = running.work
    client.call("open", session=name, cwd=str(cwd))
    cells = ["import numpy as np",
             f"x = np.random.default_rng({rep}).standard_normal({size // 8})", "x[0]"]
    walls = [timed_cell(client, name, source) for source in cells]
    out["cold"].wall.append(sum(w for w, _ in walls))  # the three cells, as one
    out["cold"].timings.append({key: sum(r["timings"].get(key, 0.0) for _, r in walls)
                                for key in ("prepare", "load", "visible_delay", "run")})
    out["cold"].paths.add(walls[0][1].get("path", "?"))
    home = walls[-1][1]["host"]

    def read(tier: str) -> dict:
        wall, reply = timed_cell(client, name, "x[0]")
        out[tier].add(wall, reply)
        if VERBOSE:
            print(f"  {name} {tier}: {wall:.3f} s on {reply['host']} "
                  f"({reply['placement']['reason']}, {reply.get('path')}) {reply['timings']}",
                  file=sys.stderr)
        return reply

    for _ in range(3):  # cheap: its median
        reply = read("memory")
        assert reply["host"] == home and reply["placement"]["reason"] == "kept", reply

    client.call("close", session=name)
    evict(running.host_store(home))
    opened = client.call("open", session=name, cwd=str(cwd))
    assert opened.host == home and opened.placement.reason == "locality", opened
    assert read("disk")["host"] == home

    moved = client.call("drain", host=home).moved
    try:
        assert moved and moved[0].session == name and moved[0].to != home, moved
        peer = moved[0].to
        evict(running.host_store(home))
        assert read("peer")["host"] == peer
        for holder in (home, peer):  # they forget x: the third host has only the remote
            forget_blobs(running.host_store(holder))
        moved = client.call("drain", host=peer).moved
        try:
            evict(running.remote)
            reply = read("remote")
            assert reply["host"] not in (home, peer), (reply, moved)
        finally:
            client.call("drain", host=peer, undo=True)
    finally:
        client.call("drain", host=home, undo=True)
    client.remove(name)  # forgotten on every host: their gc frees its copies


def carry_round(running: Door, client: Client, size: int, rep: int, out: Restore) -> None:
    """A session whose worker alone holds `g` (a generator over x, which no store can keep)
    drained off its host: the worker is dumped, its image goes to another host through the
    peer tier, and the next cell wakes it there."""
    name = f"carry-{size >> 20}-{rep}"
    client.call("open", session=name, cwd=str(running.work))
    for source in ["import numpy as np",
                   f"x = np.random.default_rng({rep}).standard_normal({size // 8})",
                   "g = (v for v in x)\nnext(g)"]:
        timed_cell(client, name, source)
    home = host_of(client, name)
    began = time.perf_counter()
    moved = client.call("drain", host=home).moved
    out.moves.append(time.perf_counter() - began)
    try:
        assert moved and moved[0].to != home, moved
        mine = next(s for s in client.status().sessions if s.session == name)
        assert mine.tier == "cool", mine  # carried, not yet restored
        out.images.append(mine.memory)
        evict(running.host_store(moved[0].to))
        wall, reply = timed_cell(client, name, "next(g)")
        out.add(wall, reply)
        assert reply["path"].startswith("pinned"), reply
    finally:
        client.call("drain", host=home, undo=True)
    client.remove(name)


def restore_table(sizes: list[int], repeat: int, work: Path) -> None:
    results = {size: {tier: Restore() for tier in TIERS} for size in sizes}
    with door("locality", work) as running, running.client() as client:
        for size in sizes:
            for rep in range(repeat):
                restore_round(running, client, size, rep, results[size])
                carry_round(running, client, size, rep, results[size]["carried"])
    print(f"\nrestore by tier: the cell x[0] after x came from each tier; medians of {repeat} "
          "session(s), of 3 cells from memory")
    print(f"{'state':>8}  {'from':<7} {'cell s':>7} {'start s':>8} {'prepare':>8} {'load s':>7}"
          f" {'cold/tier':>10}  path")
    for size, tiers in results.items():
        cold = statistics.median(tiers["cold"].wall)
        for tier, r in tiers.items():
            wall = statistics.median(r.wall)
            ratio = "-" if tier == "cold" else f"{cold / wall:.1f}x"
            print(f"{size >> 20:>4} MiB  {tier:<7} {wall:>7.3f} {r.median('visible_delay'):>8.3f}"
                  f" {r.median('prepare'):>8.3f} {r.median('load'):>7.3f} {ratio:>10}  "
                  f"{','.join(sorted(r.paths))}")
    print("cell s: the client's wall time of the cell; start s: the server's, from execute to "
          "its first\nstatement; prepare: readying its worker (the fetch included); load "
          "s: the worker's own\nload of the state. cold: a fresh session's `import numpy`, the "
          "cell that makes x, and x[0]\n(each cell saves x as it commits). carried: next(g) "
          "after a drain moved the session with\nits pinned worker (g, a generator over x, "
          "cannot be saved); the worker is restored from its image")
    for size, tiers in results.items():
        carried = tiers["carried"]
        print(f"carried {size >> 20} MiB: the drain took {statistics.median(carried.moves):.3f} s"
              f" (dump, image of {statistics.median(carried.images) / (1 << 20):.0f} MiB "
              "through the peer tier, laid out on the new host)")


# table 2: 12 sessions
@dataclass
class CellResult:
    session: int
    wall: float  # the client's, execute to reply
    timings: dict  # the reply's
    host: str
    reason: str
    path: str
    status: str

    @property
    def visible(self) -> float:
        return max(0.0, self.wall - self.timings.get("run", 0.0))

    @property
    def rest(self) -> float:
        """What the host's timings leave out of the client's wall time: the door's placing and
        moving, the wire, copying the commit to the remote."""
        t = self.timings
        return max(0.0, self.wall - sum(t.get(k, 0.0) for k in ("visible_delay", "run", "save")))


@dataclass
class Replay:
    cells: list[CellResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    status_lease: float = 0.0  # the sum of lease_seconds in the door's status
    elapsed: float = 0.0


@dataclass(frozen=True)
class Notebook:
    name: str
    folder: Path | None  # copied as the session's working directory (None: an empty one)
    sources: list[str]


def corpus(count: int, cells: int) -> list[Notebook]:
    """`count` sessions' notebooks, round robin over NOTEBOOKS, with their first `cells`."""
    out = []
    for i in range(count):
        path = CORPUS / f"{NOTEBOOKS[i % len(NOTEBOOKS)]}.ipynb"
        sources = [c.source for c in read_notebook(path).cells if c.cell_type == "code"]
        out.append(Notebook(path.stem, path.parent, sources[:cells]))
    return out


def generated(count: int, cells: int, mib: int) -> list[Notebook]:
    """`count` notebooks whose first cell builds `mib` MiB of data and whose others read it (a
    fresh worker loads it first), or now and then change it (a new version of it is saved)."""
    rows = mib * MIB // (8 * 64)
    steps = ["mean = data.mean(axis=0)\nstd = data.std(axis=0)",
             "z = (data[:1000] - mean) / std\nz.shape",
             "w = np.linalg.lstsq(data[:, 1:], data[:, 0], rcond=None)[0]\nw[:3]",
             "float(labels.mean())",
             "data = data * 0.99 + 0.01 * rng.standard_normal(data.shape)",
             "np.percentile(data[:, 0], [5, 50, 95])"]
    out = []
    for i in range(count):
        first = (f"import numpy as np\nrng = np.random.default_rng({i})\n"
                 f"data = rng.standard_normal(({rows}, 64))\n"
                 "labels = (data[:, 0] > 0).astype(int)")
        out.append(Notebook(f"generated-{mib}MiB", None,
                            [first, *(steps[k % len(steps)] for k in range(cells - 1))]))
    return out


def replay(running: Door, placement: str, label: str, plan: list[Notebook],
           think: tuple[float, float], seed: int, drafts: bool) -> Replay:
    """Every notebook of `plan` at once, one session, thread and client each."""
    result = Replay()
    lock = threading.Lock()
    start = threading.Barrier(len(plan))
    names = [f"{label}-{i:02d}" for i in range(len(plan))]

    def session(i: int, notebook: Notebook) -> None:
        rng = random.Random(seed * 1000 + i)  # the same think times under each policy
        name = names[i]
        try:
            with running.client() as client:
                try:
                    cwd = running.work / name
                    if notebook.folder is not None:
                        shutil.copytree(notebook.folder, cwd)
                    cwd.mkdir(exist_ok=True)
                    client.call("open", session=name, cwd=str(cwd))
                finally:
                    start.wait()  # all sessions begin together, opened or not
                for number, source in enumerate(notebook.sources):
                    if drafts:
                        client.draft(name, source)
                    time.sleep(rng.uniform(*think))
                    began = time.perf_counter()
                    reply, _ = execute(client, name, source)
                    cell = CellResult(i, time.perf_counter() - began, reply.get("timings", {}),
                                      reply.get("host", "?"),
                                      reply.get("placement", {}).get("reason", "?"),
                                      reply.get("path", "?"), reply.get("status", "?"))
                    with lock:
                        result.cells.append(cell)
                    if VERBOSE:
                        print(f"  {placement} {name}#{number} {cell.wall:.3f} s on {cell.host} "
                              f"({cell.reason}, {cell.path}) {cell.timings}", file=sys.stderr)
        except Exception as exc:  # the others go on; the table says which failed
            with lock:
                result.errors.append(f"{name} ({notebook.name}): {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=session, args=(i, nb)) for i, nb in enumerate(plan)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.elapsed = time.perf_counter() - began
    with running.client() as client:
        result.status_lease = sum(s.lease_seconds for s in client.status().sessions
                                  if s.session in names)
        for name in names:  # their workers go: the next workload starts on idle hosts
            with contextlib.suppress(FabricError):
                client.call("close", session=name)
    return result


def percentile(values: list[float], q: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def moves(cells: list[CellResult]) -> int:
    """Cells that ran on another host than their session's previous cell."""
    last: dict[int, str] = {}
    count = 0
    for cell in cells:  # in each session's order: appended as its cells end
        if cell.session in last and last[cell.session] != cell.host:
            count += 1
        last[cell.session] = cell.host
    return count


def sessions_table(workloads: dict[str, list[Notebook]], think: tuple[float, float], seed: int,
                   drafts: bool, work: Path) -> None:
    runs: dict[str, dict[str, Replay]] = {name: {} for name in workloads}
    for policy in ("locality", "random"):  # each on a fresh cluster, the workloads in turn
        with door(policy, work / policy) as running:
            for name, plan in workloads.items():
                runs[name][policy] = replay(running, policy, name, plan, think, seed, drafts)
    sessions = len(next(iter(workloads.values())))
    print(f"\n{sessions} sessions at once on {len(SLOTS)} hosts with {sum(SLOTS)} slots "
          f"({'+'.join(map(str, SLOTS))}), think {think[0]}-{think[1]} s (seed {seed}"
          f"{', each cell drafted first' if drafts else ''})")
    print(f"{'workload':<18} {'placement':<10} {'cells':>5} {'p50 s':>7} {'p99 s':>7} "
          f"{'lease-s':>8} {'start50':>8} {'rest50':>7} {'moves':>6} {'warm':>5} {'wall s':>7}")
    for name, by_policy in runs.items():
        figures = {}
        for policy, run in by_policy.items():
            if not run.cells:
                print(f"{name:<18} {policy:<10} no cell ran")
                continue
            visible = [c.visible for c in run.cells]
            figures[policy] = (percentile(visible, 0.5), percentile(visible, 0.99),
                               sum(c.timings.get("lease_held", 0.0) for c in run.cells),
                               percentile([c.timings.get("visible_delay", 0.0)
                                           for c in run.cells], 0.5),
                               percentile([c.rest for c in run.cells], 0.5))
            p50, p99, lease, start, rest = figures[policy]
            warm = sum(c.path.startswith("warm") for c in run.cells)
            print(f"{name:<18} {policy:<10} {len(run.cells):>5} {p50:>7.3f} {p99:>7.3f} "
                  f"{lease:>8.2f} {start:>8.3f} {rest:>7.3f} {moves(run.cells):>6} {warm:>5} "
                  f"{run.elapsed:>7.1f}")
        if len(figures) == 2:
            ratios = [r / base if base else math.nan
                      for r, base in zip(figures["random"], figures["locality"], strict=True)]
            print(f"{name:<18} {'random/loc':<10} {'':>5} {ratios[0]:>6.2f}x {ratios[1]:>6.2f}x "
                  f"{ratios[2]:>7.2f}x {ratios[3]:>7.2f}x {ratios[4]:>6.2f}x")
    print("p50, p99: visible delay, the client's wall time of execute less the cell's run; "
          "lease-s: the\nslot-seconds the cells held (replies' lease_held); start50: the "
          "host's p50 from execute to\nthe cell's first statement; rest50: p50 of the wall time "
          "the host's timings leave out (the\ndoor's placing and moving, the remote copy of "
          "the commit); moves: cells on another host\nthan the session's last; warm: cells on "
          "a kept worker (no load); wall s: the whole replay")
    for name, by_policy in runs.items():
        for policy, run in by_policy.items():
            print(f"{name} {policy}: the door's status says {run.status_lease:.2f} "
                  "lease-seconds (the hosts the sessions were open on at the end)")
            if failed := [c for c in run.cells if c.status != "ok"]:
                print(f"{name} {policy}: {len(failed)} cells ended {failed[0].status} "
                      "(their notebooks' own errors)")
            for error in run.errors:
                print(f"{name} {policy}: FAILED {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="64 MiB only, one session per size, 6 cells per notebook")
    parser.add_argument("--only", choices=("restore", "sessions"))
    parser.add_argument("--sizes", default=None, help="MiB of x, comma-separated (64,256)")
    parser.add_argument("--repeat", type=int, default=None, help="sessions per size (3)")
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--cells", type=int, default=None, help="code cells per session (20)")
    parser.add_argument("--workload", choices=("corpus", "generated", "both"), default="both")
    parser.add_argument("--state-mb", type=int, default=16,
                        help="MiB of data each generated notebook builds")
    parser.add_argument("--think", default="0.3,1.5", help="think time range, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-drafts", action="store_true",
                        help="execute each cell without drafting it first")
    parser.add_argument("--verbose", action="store_true",
                        help="each measured cell's host, placement and timings, on stderr")
    args = parser.parse_args()
    global VERBOSE
    VERBOSE = args.verbose
    sizes = [int(s) * MIB for s in (args.sizes or ("64" if args.quick else "64,256")).split(",")]
    repeat = args.repeat or (1 if args.quick else 3)
    cells = args.cells or (6 if args.quick else 20)
    low, high = (float(t) for t in args.think.split(","))
    if not CORPUS.is_dir():
        sys.exit(f"no corpus at {CORPUS}")
    # the hosts' servers inherit this environment through Ray's processes: the corpus's own
    # (no display, no network), with the threads of a lease left to the server
    os.environ.update(notebook_env())
    os.environ.pop("LLFABRIC_THREADS", None)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="llf-cluster-") as tmp:
        work = Path(tmp)
        if args.only != "sessions":
            restore_table(sizes, repeat, work / "restore")
        if args.only != "restore":
            workloads = {}
            if args.workload != "generated":
                workloads["corpus"] = corpus(args.sessions, cells)
            if args.workload != "corpus":
                workloads[f"generated-{args.state_mb}MiB"] = generated(args.sessions, cells,
                                                                       args.state_mb)
            sessions_table(workloads, (low, high), args.seed, not args.no_drafts,
                           work / "sessions")
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()

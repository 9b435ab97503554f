"""The server's costs as its store fills: each operation at 10, 100 and 1,000 sessions.

Each store holds `--versions` versions per session (100: 100,000 at 1,000 sessions), one every
ten minutes, each a cell that changed one of three variables, already thinned by the retention
policy and collected, as a server that ran all along would have left it. Building one through
commits and fsyncs would take hours, so the builder writes the store's on-disk format directly
(`build`): the objects' indexes and chunks (one 4 KiB chunk each) and the manifests, signed by
the store's key, unsynced, with their cell's time as file time; the thinned versions are those
`retention.keep` thins, their manifests kept and their data not written, as after gc.

Timed on each store (medians of a few, in seconds), in this order:

  rebuild      the first retention and gc pass on a store with no saved ledger: it reads every
               session's history and lists every file; against the I/O it is bounded by:
               listing and stat'ing every file (`listing`), reading every manifest (`manifests`)
  first pass   a server's first pass after a restart, one session written while it was down:
               loading the ledger the last one saved (`fabric.snapshot.ledger`) and reading
               what changed since (the median of 15 restarts); against the I/O it is bounded
               by: reading the ledger and the remembered chunk lists, and stat'ing each
               session's head and index (`ledger I/O`)
  save whole   writing the ledger whole, as a server's first save does (and one once the
               records appended since pass half of it): it holds what every session holds
  open         opening a session (its head, its manifest), on a host of that store
  status       the host's status with a few sessions open
  commit       a cell's commit: its manifest written, its head moved
  retention    the retention pass after a commit
  gc           the gc pass after it
  save         saving the ledger after them: a record of what they changed, appended (a server
               saves at most once a minute)
  verify       `store verify`: it hashes every byte kept, so it grows with them by design;
               against reading every file of the store (`read all`) in the same run; and, on a
               store of one large object in 16 MiB chunks read from a cold cache, its read
               rate (`verify MB/s`) against the disk's sequential one (`disk MB/s`)
  verify since `store verify --since-last` after a commit: it hashes what was written since
               the last full verify, and stats every file to find it (against `listing`)

The ratio is each operation's time at the most sessions against its time at the fewest; the
summary says, for each, whether it stays within 3x and, for one that grows, why it must. Usage:
python bench/scale.py [--sessions 10,100,1000] [--versions 100] [--dir DIR] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fabric import auth
from fabric.config import Config
from fabric.host.face import Caller
from fabric.host.local import LocalHost
from fabric.messages import Close, Open, Status
from fabric.snapshot import Group, Manifest, Store, blob_id, history, retention
from fabric.snapshot.codec import Encoded
from fabric.snapshot.commit import CellRecord, Report, commit
from fabric.snapshot.ledger import FILE as ledger_file
from fabric.snapshot.ledger import Ledger
from fabric.snapshot.packing import pack
from fabric.snapshot.store import _MANIFEST, _OBJECT, Index

STEP = 600.0  # seconds between a session's versions
CHUNK = 4096
VARIABLES = ("a", "b", "c")
POLICY = retention.RetentionPolicy()
REPEAT = 5
RESTARTS = 15  # first passes timed: each a few milliseconds, and noisy on a shared machine


def _write(path: Path, data: bytes, when: float | None = None) -> None:
    """Write `data` at `path`, as if at `when` (its file time)."""
    with open(path, "wb") as f:
        f.write(data)
    if when is not None:
        os.utime(path, (when, when))


def new_object(store: Store, seed: bytes, when: float | None = None) -> str:
    """An object of one 4 KiB chunk, written as `put_object` lays it out (at `when`); its id."""
    chunk = seed.ljust(CHUNK, b"\0")
    chunk_id = blob_id(chunk)
    index = _OBJECT + pack({"stream": seed, "chunk": CHUNK, "buffers": [[CHUNK, [chunk_id]]]})
    ident = blob_id(index)
    for blob, data in ((chunk_id, chunk), (ident, index)):
        path = store.disk.path(blob)
        path.parent.mkdir(exist_ok=True)
        _write(path, data, when)
    return ident


def _manifest_id(store: Store, manifest: Manifest) -> tuple[str, bytes]:
    body = manifest.encode()
    data = _MANIFEST + store._sign(body) + body  # the layout `put_manifest` writes
    return blob_id(data), data


def build(root: Path, sessions: int, versions: int, now: float) -> Store:
    """A store of `sessions` sessions of `versions` versions each, thinned and collected."""
    store = Store(root)
    for s in range(sessions):
        name = f"s{s:04d}"
        ambient = store.put(f"ambient {name}".encode())
        # each version's groups, by a placeholder per object: only kept versions' are written
        placed: dict[str, Group] = {}
        cells: list[tuple[int, float, str, tuple[Group, ...]]] = []
        for number in range(1, versions + 1):
            var = VARIABLES[number % len(VARIABLES)]
            placed[var] = Group(f"{name}/{number}", (var,), CHUNK)
            cells.append((number, now - (versions - number) * STEP, var, tuple(placed.values())))
        kept = retention.keep([retention.Version(number, when) for number, when, _, _ in cells],
                              POLICY, now)
        objects = {g.blob: new_object(store, g.blob.encode(), when)
                   for number, when, _, groups in cells if number in kept for g in groups}
        thinned: dict[str, float] = {}
        parent = None
        for number, when, var, groups in cells:
            manifest = Manifest(
                session=name, version=number, parent=parent, ambient=ambient,
                groups=tuple(Group(objects.get(g.blob) or blob_id(g.blob.encode()), g.names,
                                   g.size) for g in groups),
                cell={"execution_count": number, "status": "ok", "time": when,
                      "source": f"{var} = step({number})"})
            ident, data = _manifest_id(store, manifest)
            _write(store.root / "manifests" / ident, data, when)
            if number not in kept:
                thinned[ident] = 0.0  # thinned, and freed by gc
            parent = ident
        folder = store.root / "sessions" / name
        folder.mkdir(parents=True)
        _write(folder / "index", Index(thinned=thinned).encode())
        _write(folder / "head", f"{parent}\n".encode())
    return store


def timed(run: Callable[[], object], repeat: int = 1) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def listing(root: Path) -> None:
    """List and stat every file of the store: the least a pass that looks at each does."""
    for top in (root / "blobs", root / "manifests"):
        for entry in os.scandir(top):
            for inner in os.scandir(entry.path) if entry.is_dir() else [entry]:
                inner.stat(follow_symlinks=False)


def read_all(root: Path, only: str | None = None) -> int:
    """Read every file of the store's blobs and manifests (or of `only` of them); the bytes."""
    total = 0
    for top in [root / only] if only else [root / "blobs", root / "manifests"]:
        for entry in os.scandir(top):
            for inner in os.scandir(entry.path) if entry.is_dir() else [entry]:
                with open(inner.path, "rb") as f:
                    total += len(f.read())
    return total


def ledger_io(store: Store) -> None:
    """Read the saved ledger and the remembered chunk lists, and stat each session's head and
    index: what a first pass after a restart must read to trust them."""
    for name in (ledger_file, "chunks", "chunks.sorted"):
        with contextlib.suppress(FileNotFoundError):
            (store.root / name).read_bytes()
    store.stamps()


def _uncached(path: Path) -> None:
    """Drop a synced file's pages from the page cache: its next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_bandwidth(folder: Path, nbytes: int) -> float:
    """The disk's sequential read bandwidth, bytes a second: a file written, synced and
    dropped from the page cache, then read."""
    path = folder / "bandwidth"
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(nbytes >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    _uncached(path)
    began = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    seconds = time.perf_counter() - began
    path.unlink()
    return nbytes / seconds


def verify_bandwidth(folder: Path, nbytes: int) -> float:
    """`store verify`'s read rate, bytes a second, over a store of one object of `nbytes` in
    chunks of the store's size (16 MiB), from a cold cache."""
    store = Store(folder / "large")
    store.put_object(Encoded(b"", [memoryview(os.urandom(nbytes))]))  # each file synced
    for path in store.disk.files():
        _uncached(path)
    return nbytes / timed(lambda: history.verify(store))


def measure(root: Path, sessions: int, versions: int) -> dict[str, float]:
    now = time.time()
    began = time.perf_counter()
    store = build(root, sessions, versions, now)
    built = time.perf_counter() - began
    os.sync()  # the build's writes, else flushed by the first fsyncs timed (a commit's, a save's)
    names = store.sessions()
    out: dict[str, float] = {"build": built}
    out["listing"] = timed(lambda: listing(root))
    out["manifests"] = timed(lambda: read_all(root, "manifests"))
    ran = Ledger(store)  # a server that ran all along
    out["rebuild"] = timed(lambda: full_pass(ran))
    full_pass(ran)  # and again, as a server's passes do, reading what the first's frees wrote
    out["save whole"] = timed(lambda: save_whole(ran), REPEAT)
    out["ledger bytes"] = (root / ledger_file).stat().st_size
    one_commit(store, names[0])  # while no server runs
    host = LocalHost(Config(store=root, runtime_dir=root.parent / "run"), send=lambda *a: None)
    # servers started anew, each on the ledger saved before that commit (a pass saves again
    # only a minute after it was)
    out["first pass"] = timed(lambda: full_pass(Ledger(Store(root))), RESTARTS)
    out["ledger I/O"] = timed(lambda: ledger_io(host.store), RESTARTS)
    ledger = Ledger(host.store)
    full_pass(ledger)
    caller = Caller(auth.owner_name())

    async def open_close(name: str) -> None:
        await host.open(caller, Open(name))
        await host.close(caller, Close(name))

    picks = itertools.cycle(names)
    out["open"] = timed(lambda: asyncio.run(open_close(next(picks))), REPEAT)
    for name in names[:3]:
        asyncio.run(host.open(caller, Open(name)))
    out["status"] = timed(lambda: asyncio.run(host.status(caller, Status())), REPEAT)
    rounds: dict[str, list[float]] = {"commit": [], "retention": [], "gc": [], "save": []}
    protect = {s.head for s in host.sessions.values() if s.head}
    for name in itertools.islice(itertools.cycle(names[-REPEAT:]), REPEAT):
        rounds["commit"].append(timed(lambda name=name: one_commit(host.store, name)))
        rounds["retention"].append(timed(lambda: ledger.retain(POLICY, protect)))
        rounds["gc"].append(timed(lambda: ledger.collect(time.time())))
        rounds["save"].append(timed(ledger.save))
    out |= {op: statistics.median(times) for op, times in rounds.items()}
    out["verify"] = timed(lambda: history.verify(host.store))
    one_commit(host.store, names[-1])
    since = history.last_verified(host.store)
    out["verify since"] = timed(lambda: history.verify(host.store, since=since))
    out["read all"] = timed(lambda: out.__setitem__("bytes", read_all(root)))
    return out


def save_whole(ledger: Ledger) -> None:
    """Save the ledger where it has no file to append to: written whole."""
    (ledger.store.root / ledger_file).unlink()
    ledger.save()


def full_pass(ledger: Ledger) -> None:
    ledger.retain(POLICY, set())
    ledger.collect()


def one_commit(store: Store, name: str) -> None:
    """Commit a cell that changed `a` on `name`'s head (its object written beforehand)."""
    head = store.head(name)
    blob = new_object(store, os.urandom(16))
    report = Report(groups=[(blob, ["a"], CHUNK)], kept=[], imports={}, refs={}, packages={},
                    ambient=Manifest.decode(store.get_manifest(head)).ambient or "",
                    owned=["a"], unsaved={})
    commit(store, name, head, report, CellRecord("a = 1", 1, "ok", 0.0, frozenset()))


OPERATIONS = ("first pass", "open", "status", "commit", "retention", "gc", "save", "verify",
              "verify since")
LIMIT = 3.0  # the most an operation may grow from the fewest sessions to the most
FLOORS = ("rebuild", "save whole", "listing", "manifests", "ledger I/O", "read all")
MB = 1 << 20


def against_io(results: dict[int, dict[str, float]], low: int, high: int) -> str:
    """How much the first pass grows against the I/O it must do (`ledger_io`): what grows with
    the sessions kept, where the work of what changed stays the same."""
    lo, hi = results[low], results[high]
    return (f"from {low} to {high} sessions the pass grew by "
            f"{(hi['first pass'] - lo['first pass']) * 1e3:.1f} ms and that I/O by "
            f"{(hi['ledger I/O'] - lo['ledger I/O']) * 1e3:.1f} ms")


def why(op: str, results: dict[int, dict[str, float]], low: int, high: int) -> str:
    """Why an operation that grows past LIMIT must: what it is bounded by, as measured."""
    lo, hi = results[low], results[high]
    if op == "first pass":
        return (f"it loads the saved ledger ({hi['ledger bytes'] / MB:.1f} MB at {high} "
                f"sessions: what each session holds) and the remembered chunk lists, and stats "
                f"each session's head and index before trusting them, all growing with the "
                f"sessions kept; {against_io(results, low, high)}; the pass with no ledger it "
                f"replaces took {hi['rebuild']:.2f} s ({hi['rebuild'] / hi[op]:.0f}x as long)")
    if op == "verify":
        grown = hi["bytes"] / lo["bytes"]
        return (f"it reads and hashes every byte kept ({grown:.0f}x the bytes; "
                f"{hi[op] / lo[op] / grown:.1f}x per byte): over 16 MiB chunks from a cold "
                f"cache it reads {hi['verify rate'] / MB:.0f} MB/s where the disk reads "
                f"{hi['disk'] / MB:.0f} MB/s; these stores' 4 KiB chunks cost a file each: "
                f"it takes {hi[op] / hi['read all']:.1f}x the time to only read every file at "
                f"{high} sessions, {lo[op] / lo['read all']:.1f}x at {low}")
    if op == "verify since":
        return (f"it stats every file to find those changed since the last full verify (a "
                f"stat each, no read): {hi[op] / hi['listing']:.1f}x the time to list and stat "
                f"them at {high} sessions, {lo[op] / lo['listing']:.1f}x at {low}")
    return ("UNEXPECTED: it costs what changed, the same on any store (a loaded machine? "
            "run it again)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="10,100,1000", help="store sizes, in sessions")
    parser.add_argument("--versions", type=int, default=100, help="versions per session")
    parser.add_argument("--dir", type=Path, default=None, help="where to build (default: $TMPDIR)")
    parser.add_argument("--quick", action="store_true", help="2, 4 and 8 sessions of 30 versions")
    args = parser.parse_args()
    sizes = [2, 4, 8] if args.quick else [int(n) for n in args.sessions.split(",")]
    versions = 30 if args.quick else args.versions
    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="llf-scale-") as tmp:
            results[n] = measure(Path(tmp) / "store", n, versions)
            large = (32 if args.quick else 256) << 20
            results[n]["disk"] = disk_bandwidth(Path(tmp), large)
            results[n]["verify rate"] = verify_bandwidth(Path(tmp), large)
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"built {n} sessions ({n * versions} versions) in {results[n]['build']:.1f} s",
              flush=True)
    low, high = sizes[0], sizes[-1]
    print(f"\n{'seconds':12}" + "".join(f"{f'{n} sessions':>14}" for n in sizes)
          + f"{f'{high}/{low}':>10}")
    ratios: dict[str, float] = {}
    for op in (*OPERATIONS, *FLOORS):
        ratios[op] = results[high][op] / results[low][op]
        print(f"{op:12}" + "".join(f"{results[n][op]:14.4f}" for n in sizes)
              + f"{ratios[op]:9.1f}x")
    print(f"{'MB kept':12}" + "".join(f"{results[n]['bytes'] / MB:14.1f}" for n in sizes))
    print(f"{'disk MB/s':12}" + "".join(f"{results[n]['disk'] / MB:14.0f}" for n in sizes))
    print(f"{'verify MB/s':12}" + "".join(f"{results[n]['verify rate'] / MB:14.0f}"
                                          for n in sizes))
    print()
    for op in OPERATIONS:
        grows = ratios[op] > LIMIT
        print(f"{op}: {ratios[op]:.1f}x" + (f", over {LIMIT:.0f}x: {why(op, results, low, high)}"
                                            if grows else f", within {LIMIT:.0f}x"))
    print(f"first pass I/O: {ratios['ledger I/O']:.1f}x: reading the ledger and the remembered "
          f"chunk lists, and stat'ing each session's head and index; "
          f"{against_io(results, low, high)}")
    print(f"save whole: {ratios['save whole']:.1f}x: it writes what every session holds "
          f"({results[high]['ledger bytes'] / MB:.1f} MB at {high} sessions), off the cell "
          "path: at a server's first save, and once the records appended since pass half of it")
    floor = {n: results[n]["listing"] + results[n]["manifests"] for n in sizes}
    print(f"rebuild: {ratios['rebuild']:.1f}x: with no saved ledger (once, or after a damaged "
          "one), the first pass reads every session's history and lists every file: "
          + ", ".join(f"{results[n]['rebuild'] / floor[n]:.1f}x" for n in sizes)
          + " the time to list every file and read every manifest at "
          + ", ".join(map(str, sizes)) + " sessions")
    bounded = [op for op in OPERATIONS if op not in ("first pass", "verify", "verify since")]
    worst = max(bounded, key=lambda op: ratios[op])
    print(f"scale: worst ratio {ratios[worst]:.1f}x ({worst}) at {high} sessions against {low}")


if __name__ == "__main__":
    main()

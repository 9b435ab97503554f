"""Snapshot store throughput on a mixed notebook state, against the disk itself, in one run.

The state (about --size GB): numpy arrays, torch tensors, a small torch model with its Adam
optimizer, a pandas DataFrame and many small Python objects. Measured on the same disk, in the
same run, each with an fsync where it writes:

  raw disk      one file of the state's size: write+fsync, and read back; and the same bytes
                as 16 MiB files written (each fsync'd) and read 4 at a time, as the store does
  memcpy        one copy of the state's bytes in memory
  llfabric      save (group, pickle out of band, chunk, hash, write) and load (read, verify,
                unpickle), and delta saves (as a worker makes them) after a cell that touched
                nothing, one that read everything and changed nothing (the large buffers' chunks
                hashed only where the kernel saw them written, the small objects found unchanged
                by their marshal fingerprint, unpickled: `fabric.snapshot.plain`; against the
                same save with tracking off, pickling every group and hashing every buffer), one
                that read only the arrays, and one that changed one tensor; and what the
                tracking costs a cell: writing every page of an array right after a save (each
                page traps once) and again
  dill          dill.dump_module / load_module of a module holding the state (dump_session),
                in each round
  torch.save    torch.save / torch.load of the same dict
  Kishu         its checkpoint (its hooks after the cell that built the state, and after cells
                like the delta saves') and its checkout of that commit after every variable
                was deleted, in a real ipykernel of its own environment (build/kishu-venv,
                made on first use): bench/kishu_peer.py says how and exactly what is timed

Reads come after evicting the files from the page cache (posix_fadvise DONTNEED), so they hit the
disk as a new worker's would, and then again from the page cache (as a load right after a save,
or on a host whose cache holds the state). Then cells whose draft missed: the time from execute
to their first statement on a fresh worker that loads their closure, by the closure's size,
against loading it in this process. bench/small_objects.py times the small objects alone
against pickle. Usage:
python bench/store.py [--size 0.5] [--dir DIR] [--no-dill] [--no-kishu] [--repeat 3]
                      [--first 0.01,0.1,0.5,1]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import kishu_peer
import numpy as np
import pandas as pd
import torch

from fabric.client import Client
from fabric.config import Config
from fabric.embedded import EmbeddedServer
from fabric.snapshot import Store, dumps, loads
from fabric.snapshot.delta import DeltaSaver
from fabric.snapshot.store import CHUNK, THREADS


def make_state(size: float) -> dict:
    """About `size` GB: 40% numpy, 40% torch, 10% pandas, a model, small objects."""
    total = int(size * 1e9)
    rng = np.random.default_rng(0)
    state: dict = {}
    for i in range(4):
        state[f"arr{i}"] = rng.random(total // 10 // 8)
    for i in range(3):
        state[f"ten{i}"] = torch.randn(total // 10 // 4)
    state["half"] = torch.randn(total // 10 // 2).to(torch.bfloat16)
    state["df"] = pd.DataFrame({c: rng.random(total // 10 // 8 // 4) for c in "abcd"})
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(32, 512)).sum().backward()
    optimizer.step()
    state["model"], state["optimizer"] = model, optimizer
    state["records"] = [{"id": i, "name": f"row{i}", "score": i * 0.5} for i in range(100_000)]
    state["vocab"] = {f"word{i}": i for i in range(100_000)}
    return state


def nbytes(state: dict) -> int:
    out = 0
    for v in state.values():
        if isinstance(v, np.ndarray):
            out += v.nbytes
        elif isinstance(v, torch.Tensor):
            out += v.untyped_storage().nbytes()
        elif isinstance(v, pd.DataFrame):
            out += int(v.memory_usage(index=True).sum())
    return out


def evict(root: Path) -> None:
    """Drop `root`'s files from the page cache, so the next read comes from the disk."""
    paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def raw_disk(work: Path, size: int) -> tuple[float, float]:
    """One fsync'd write of `size` bytes and one read of them from the disk."""
    data = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
    path = work / "raw"

    def write() -> None:
        with open(path, "wb", buffering=0) as f:
            view = memoryview(data)
            while view:
                view = view[f.write(view):]
            os.fsync(f.fileno())

    def read() -> None:
        out = bytearray(size)
        with open(path, "rb", buffering=0) as f:
            f.readinto(out)

    write_s = timed(write)[0]
    evict(path)
    read_s = timed(read)[0]
    path.unlink()
    return write_s, read_s


def raw_disk_parallel(work: Path, size: int) -> tuple[float, float]:
    """The disk at the store's own access pattern: 16 MiB files, each fsync'd, 4 at a time;
    read from the disk, then again from the page cache."""
    data = np.random.default_rng(2).integers(0, 255, size, dtype=np.uint8)
    pieces = [(work / f"raw{i}", memoryview(data)[start:start + CHUNK])
              for i, start in enumerate(range(0, size, CHUNK))]

    def write(piece: tuple[Path, memoryview]) -> None:
        with open(piece[0], "wb", buffering=0) as f:
            view = piece[1]
            while view:
                view = view[f.write(view):]
            os.fsync(f.fileno())

    def read(piece: tuple[Path, memoryview]) -> None:
        with open(piece[0], "rb", buffering=0) as f:
            f.readinto(bytearray(len(piece[1])))

    with ThreadPoolExecutor(THREADS) as pool:
        write_s = timed(lambda: list(pool.map(write, pieces)))[0]
        for path, _ in pieces:
            evict(path)
        read_s = timed(lambda: list(pool.map(read, pieces)))[0]
        cached_s = timed(lambda: list(pool.map(read, pieces)))[0]  # now in the page cache
    for path, _ in pieces:
        path.unlink()
    return write_s, read_s, cached_s


def memcpy(size: int) -> float:
    src = np.ones(size, dtype=np.uint8)
    dst = np.zeros_like(src)
    np.copyto(dst, src)  # the pages are mapped now: time the copy, not the page faults
    t, _ = timed(lambda: np.copyto(dst, src))
    return t


def llfabric_once(root: Path, state: dict) -> dict[str, float]:
    ns = {"__name__": "__main__", **state}
    names = list(state)
    saver = DeltaSaver(Store(root / "all"))  # what a worker holds between the cells it runs
    out = {}
    out["save"], first = timed(lambda: saver.save(ns, names, None))
    evict(root)
    fresh = Store(root / "all")
    ids = [blob for blob, _, _ in first.groups]
    out["load"], _ = timed(lambda: [loads(e, {}) for e in fresh.get_objects(ids)])
    again = Store(root / "all")  # the chunks are in the page cache now
    out["cached load"], _ = timed(lambda: [loads(e, {}) for e in again.get_objects(ids)])
    out["delta: cell touched nothing"], _ = timed(lambda: saver.save(ns, names, set()))
    large = {n for n, v in state.items() if isinstance(v, np.ndarray | torch.Tensor)}
    for key, reached in (("read all", None), ("read the arrays", large)):
        saver.track = False  # the baseline: every group pickled, every buffer hashed
        out[f"delta: {key}, changed nothing, hashing all"], _ = timed(
            lambda r=reached: saver.save(ns, names, r))
        saver.track = True
        out[f"delta: {key}, changed nothing"], _ = timed(
            lambda r=reached: saver.save(ns, names, r))
    state["ten0"][:1000] += 1
    out["delta: one tensor changed"], _ = timed(lambda: saver.save(ns, names, {"ten0"}))
    # what tracking costs a cell: the first write to each page after a save traps once
    array = state["arr0"]
    out["arr0 bytes"] = array.nbytes
    out["write arr0 after a save"], _ = timed(lambda: np.add(array, 0, out=array))
    out["write arr0 again"], _ = timed(lambda: np.add(array, 0, out=array))
    shutil.rmtree(root)
    return out


def large_only(root: Path, state: dict) -> tuple[float, float]:
    """The large buffers alone: the codec and the store, without grouping and small objects."""
    store = Store(root)
    large = [n for n, v in state.items() if isinstance(v, np.ndarray | torch.Tensor)]
    save, ids = timed(lambda: [store.put_object(dumps({n: state[n]}, {})) for n in large])
    evict(root)
    fresh = Store(root)
    load, _ = timed(lambda: [loads(e, {}) for e in fresh.get_objects(ids)])
    shutil.rmtree(root)
    return save, load


def llfabric(work: Path, state: dict, repeat: int, dill: bool) -> dict[str, float]:
    """Medians over `repeat` rounds (and each delta save's worst round); each round measures
    the raw disk (and dill) right before llfabric on the same bytes, and the ratios are taken
    within a round (this disk's speed drifts)."""
    size = nbytes(state)
    large = nbytes({n: v for n, v in state.items() if isinstance(v, np.ndarray | torch.Tensor)})
    runs = []
    for i in range(repeat):
        run = dict(zip(("raw write", "raw read"), raw_disk(work, size), strict=True))
        run |= dict(zip(("par write", "par read", "par cached read"),
                        raw_disk_parallel(work, size), strict=True))
        if dill:
            run |= dict(zip(("dill save", "dill load", "dill cached load"),
                            dill_session(work, state), strict=True))
        ours = llfabric_once(work / f"store{i}", state)
        run |= ours
        run |= {"cached load/par": run["par cached read"] / run["cached load"]}
        if dill:
            run |= {"dill/save": run["dill save"] / run["save"],
                    "dill/load": run["dill load"] / run["load"],
                    "dill/cached load": run["dill cached load"] / run["cached load"]}
        run |= dict(zip(("raw large write", "raw large read"), raw_disk(work, large),
                        strict=True))
        run |= dict(zip(("par large write", "par large read"),
                        raw_disk_parallel(work, large)[:2], strict=True))
        large_save, large_load = large_only(work / f"large{i}", state)
        run |= {"large save": large_save, "large load": large_load}
        run |= {"save/par": run["par write"] / run["save"],
                "load/par": run["par read"] / run["load"],
                "save/raw": run["raw write"] / run["save"],
                "load/raw": run["raw read"] / run["load"],
                "large save/par": run["par large write"] / large_save,
                "large load/par": run["par large read"] / large_load,
                "large save/raw": run["raw large write"] / large_save,
                "large load/raw": run["raw large read"] / large_load}
        runs.append(run)
    worst = {f"{k} worst": max(run[k] for run in runs) for k in runs[0] if k.startswith("delta")}
    return {k: statistics.median(run[k] for run in runs) for k in runs[0]} | worst | \
        {"large": large}


def dill_session(work: Path, state: dict) -> tuple[float, float, float]:
    """dill's dump_session and load_session: from the disk, then from the page cache."""
    import dill

    # dump_session saves __main__, as a notebook's namespace is: put the state there. dill cannot
    # pickle a torch optimizer (a typing sentinel in its hooks): it gets the state_dict instead.
    state = {**state, "optimizer": state["optimizer"].state_dict()}
    main = sys.modules["__main__"]
    main.__dict__.update(state)
    path = work / "session.dill"

    def dump() -> None:
        with open(path, "wb") as f:
            dill.dump_module(f)
            f.flush()
            os.fsync(f.fileno())

    try:
        save, _ = timed(dump)
        evict(path)
        load, _ = timed(lambda: dill.load_module(str(path)))
        for name in state:  # freeing the first load's objects is no part of the second's time
            main.__dict__.pop(name, None)
        cached, _ = timed(lambda: dill.load_module(str(path)))
    finally:
        for name in state:
            main.__dict__.pop(name, None)
        path.unlink(missing_ok=True)
    return save, load, cached


def torch_save(work: Path, state: dict) -> tuple[float, float]:
    path = work / "state.pt"

    def dump() -> None:
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    save, _ = timed(dump)
    evict(path)
    load, _ = timed(lambda: torch.load(path, weights_only=False))
    path.unlink()
    return save, load


# A pause before each timed cell, as a user's thinking is: the last cell's worker has exited,
# where back to back its teardown would compete with the next one's load for this host's cores.
THINK_S = 0.5


def first_statement(work: Path, sizes: list[float], repeat: int) -> list[tuple[float, ...]]:
    """Cells whose draft missed: from execute to the first statement of a cell reading `x` (of
    each size, in GB), on a fresh worker that loads it, against loading the same object in this
    process (from the page cache, as the worker's load is) and a cell that reads nothing; and of
    a cell that reads `x` only in a branch it does not take (its load waits for the branch).
    Medians of `repeat` cells: (GB, load here, delay of a cell reading nothing, delay, delay
    less the worker's own load, delay of the branch not taken)."""
    config = Config(store=work / "first", runtime_dir=work, bind=f"ipc://{work}/first.sock")
    rows = []
    with EmbeddedServer(config, {**os.environ, "LLFABRIC_KEEP_WARM": "0"}), \
            Client(config.address) as client:
        def delay(session: str, source: str) -> tuple[float, float]:
            time.sleep(THINK_S)
            timings = client.call("execute", timeout=0, session=session,
                                  source=source).timings
            return timings["visible_delay"], timings["load"]

        def delays(session: str, source: str) -> tuple[float, float]:
            """Medians: the visible delay, and what of it the worker did not spend loading."""
            runs = [delay(session, source) for _ in range(repeat)]
            return (statistics.median(seen for seen, _ in runs),
                    statistics.median(seen - load for seen, load in runs))

        for size in sizes:
            session, n = f"first-{size}", int(size * 1e9 / 8)
            client.call("open", session=session, cwd=str(work))
            client.call("execute", timeout=0, session=session,
                        source=f"import numpy as np\nx = np.random.default_rng(0).random({n})"
                               "\nflag = False")
            store = Store(work / f"here-{size}")
            ident = store.put_object(dumps({"x": np.random.default_rng(0).random(n)}, {}))
            here = statistics.median(timed(lambda s=store, i=ident: loads(s.get_object(i), {}))[0]
                                     for _ in range(repeat))
            rows.append((size, here, delays(session, "1 + 1")[0], *delays(session, "x[0]"),
                         delays(session, "if flag:\n    x[0]")[0]))
            client.call("close", session=session)
            shutil.rmtree(work / f"here-{size}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=0.5, help="GB of state (default 0.5)")
    parser.add_argument("--dir", type=Path, default=None, help="Where to write (default: $TMPDIR)")
    parser.add_argument("--no-dill", action="store_true", help="Skip dill (slow at large sizes)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="Runs of the raw disk and llfabric measurements (medians shown)")
    parser.add_argument("--first", default="0.01,0.1,0.5,1",
                        help="closure sizes (GB) of the draft-missed cells timed (default "
                             "0.01,0.1,0.5,1; empty: none)")
    parser.add_argument("--kishu", action=argparse.BooleanOptionalAction, default=True,
                        help="Drive Kishu in its own venv, made on first use (default: on)")
    args = parser.parse_args()

    kishu_exe, kishu_note = None, "Kishu: not measured (--no-kishu)."
    if args.kishu:  # first: a venv that cannot be made is known before the long measurements
        try:
            kishu_exe = kishu_peer.python()
        except kishu_peer.KishuUnavailable as exc:
            kishu_note = f"Kishu: not measured: {exc}"
    state = make_state(args.size)
    size, names = nbytes(state), list(state)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="llf-bench-") as tmp:
        work = Path(tmp)
        ours = llfabric(work, state, args.repeat, not args.no_dill)
        copy = memcpy(size)
        rows = [("raw disk, one file (fsync'd)", ours["raw write"], ours["raw read"]),
                ("raw disk, 16 MiB files x4 (fsync'd)", ours["par write"], ours["par read"]),
                ("  the same files from the page cache", float("nan"), ours["par cached read"]),
                ("memcpy", copy, copy), ("llfabric", ours["save"], ours["load"]),
                ("  loaded from the page cache", float("nan"), ours["cached load"]),
                ("torch.save / torch.load", *torch_save(work, state))]
        dill = None if args.no_dill else (ours["dill save"], ours["dill load"])
        if dill is not None:
            rows += [("dill dump/load_session (*)", *dill),
                     ("  loaded from the page cache", float("nan"), ours["dill cached load"])]
        sizes = [float(x) for x in args.first.split(",") if x.strip()]
        first = first_statement(work, sizes, args.repeat) if sizes else []
        kishu = None
        if kishu_exe is not None:
            del state  # the kernel builds its own copy: do not hold two
            gc.collect()
            try:
                kishu = kishu_peer.measure(kishu_exe, work / "kishu", inspect.getsource(make_state),
                                           args.size, names, evict)
            except RuntimeError as exc:
                kishu_note = f"Kishu: failed: {exc}"
        if kishu is not None:
            rows.append(("Kishu checkpoint / checkout (*)", kishu.checkpoint, kishu.checkout))

    gb, lgb = size / 1e9, ours["large"] / 1e9
    print(f"state: {gb:.2f} GB in buffers, {len(names)} variables "
          f"(+ a model, its optimizer, 200k small objects); medians of {args.repeat} rounds\n")
    print(f"{'':36} {'save s':>8} {'GB/s':>6} {'load s':>8} {'GB/s':>6}"
          f" {'save / llfabric':>16} {'load / llfabric':>16}")
    for name, save, load in rows:
        if math.isnan(save):  # a load alone
            saved, ratio = f"{'':8} {'':6}", f"{'':16}"
        else:
            saved, ratio = f"{save:8.3f} {gb / save:6.2f}", f"{save / ours['save']:16.2f}"
        print(f"{name:36} {saved} {load:8.3f} {gb / load:6.2f} {ratio} "
              f"{load / ours['load']:16.2f}")
    print(f"\nwhole state: llfabric save at {ours['save/raw']:.0%} of one-file raw write, "
          f"{ours['save/par']:.0%} of chunked raw write; load at {ours['load/raw']:.0%} and "
          f"{ours['load/par']:.0%} of those reads (ratios within each round)")
    print(f"from the page cache: llfabric loads at {ours['cached load/par']:.0%} of the chunked "
          f"raw read's speed")
    if dill is not None:
        print(f"whole state against dill: llfabric saves {ours['dill/save']:.2f}x and loads "
              f"{ours['dill/load']:.2f}x as fast as dill's dump/load_session "
              f"({ours['dill/cached load']:.2f}x from the page cache; ratios within each round)")
    print(f"large buffers alone ({lgb:.2f} GB): save {lgb / ours['large save']:.2f} GB/s = "
          f"{ours['large save/raw']:.0%} of one-file, {ours['large save/par']:.0%} of chunked raw "
          f"write; load {lgb / ours['large load']:.2f} GB/s = {ours['large load/raw']:.0%} and "
          f"{ours['large load/par']:.0%} of those reads")
    for key in ("delta: cell touched nothing", "delta: read all, changed nothing",
                "delta: read the arrays, changed nothing", "delta: one tensor changed"):
        line = f"{key:39} {ours[key]:8.4f} s (worst {ours[f'{key} worst']:.4f})"
        if f"{key}, hashing all" in ours:
            baseline = ours[f"{key}, hashing all"]
            line += f"   tracking off {baseline:8.4f} s = {baseline / ours[key]:.3g} x"
        if kishu is not None and key in kishu.deltas:
            seconds, written = kishu.deltas[key]
            line += (f"   Kishu {seconds:8.4f} s = {seconds / ours[key]:.3g} x llfabric, "
                     f"stored {written / 1e9:.3f} GB")
        print(line)
    print(f"a cell writing every page of arr0 ({ours['arr0 bytes'] / 1e6:.0f} MB): "
          f"{ours['write arr0 after a save']:.4f} s first after a save (each page traps once), "
          f"{ours['write arr0 again']:.4f} s again")
    if first:
        print(f"\ncells whose draft missed (a fresh worker loads the closure; medians of "
              f"{args.repeat}): from execute to the first statement")
        print(f"{'closure GB':>10} {'load here s':>12} {'empty cell s':>13} {'cell s':>8} "
              f"{'- load here':>12} {'- its load':>11} {'x in a branch not taken s':>26}")
        for gbs, here, empty, delay, beyond, branch in first:
            print(f"{gbs:10.2f} {here:12.3f} {empty:13.3f} {delay:8.3f} {delay - here:12.3f} "
                  f"{beyond:11.3f} {branch:26.3f}")
        print("(- its load: the delay less the seconds the cell's worker spent loading)")
    if not args.no_dill:
        print("(*) dill cannot pickle the Adam optimizer: it saved the optimizer's state_dict")
    if kishu is None:
        print("\n" + kishu_note)
        return
    print("(*) Kishu pickles with dill too: its cell kept the optimizer's state_dict (and deleted "
          "the function that built the state; see bench/kishu_peer.py)")
    groups = ", ".join(f"{len(group)} variables" if len(group) > 1 else group[0]
                       for group in kishu.snapshots)
    print(f"\nKishu checkpoint: its cell hooks after the state's cell (the cell itself took "
          f"{kishu.cell:.1f} s); its own timer (planning and writing the snapshots) says "
          f"{kishu.own_checkpoint:.1f} s.\nIt stored the state as {len(kishu.snapshots)} "
          f"snapshots ({groups}; it stores variables whose objects it links together), in a "
          f"SQLite database of {kishu.db_bytes / 1e9:.2f} GB.\nKishu checkout: _kishu.checkout() "
          f"of that commit after a cell deleted every variable, its database evicted from the "
          f"page cache; every variable came back as committed.")
    if kishu.not_stored:
        print(f"Kishu did not store {', '.join(kishu.not_stored)}: its checkout reran cells")


if __name__ == "__main__":
    main()

"""Warm worker start vs a cold interpreter, measured in one run.

Prints, for an import family (default: torch), the median time to
  cold:      `python -c "import <modules>"` (what a fresh kernel pays before any cell),
  fork:      a worker forked from a zygote that has imported the family, until it says hello,
  template:  a worker restored by CRIU from the family's template, until it says hello,
  N at once: N template restores started together, until all have said hello (per worker),
  warm:      the session's kept worker (parked between cells): unparked and answering a load
             of nothing (on a GPU host unparking adds the CUDA restore; here it is free),
  cool:      a parked worker that was CRIU-dumped to disk, restored until it says hello again,
and each one's ratio against the cold start. Templates need root, CRIU and llfabric-init;
without them their rows say why. Usage:
  python bench/warm_start.py [--modules torch,numpy] [-n 10] [--concurrent 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fabric.pool import Pool, criu, lifecycle
from fabric.worker.messages import Load, Loaded


def cold(modules: list[str], n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import " + ", ".join(modules)], check=True)
        times.append(time.perf_counter() - start)
    return times


async def _timed(start_worker, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        worker = await start_worker()
        times.append(time.perf_counter() - start)
        await worker.close()
    return times


async def warm(modules: list[str], n: int, concurrent: int) -> dict[str, object]:
    family = frozenset(modules)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as store:
        pool = Pool(Path(store), worker_source="template" if not criu.unavailable() else "zygote")
        await pool.start()
        try:
            start = time.perf_counter()
            await pool.zygote_for(family)
            results["zygote built"] = time.perf_counter() - start
            results["fork"] = await _timed(lambda: pool.fork_worker(family), n)
            results["warm"] = await _warm_resumes(pool, family, n)
            if pool.worker_source != "template":
                return results
            start = time.perf_counter()
            pool.templates.build_soon(family)
            template = await pool.templates.wait(family)
            results["template built"] = time.perf_counter() - start
            if template.state != "ready":
                results["template error"] = template.error
                return results
            results["template bytes"] = template.size
            results["template"] = await _timed(lambda: pool.restore_worker(template), n)
            start = time.perf_counter()
            workers = await asyncio.gather(*(pool.restore_worker(template)
                                             for _ in range(concurrent)))
            results["concurrent"] = [(time.perf_counter() - start) / concurrent]
            for worker in workers:
                await worker.close()
            results["cool"] = await _cool_resumes(pool, family, n)
        finally:
            await pool.stop()
    return results


async def _warm_resumes(pool: Pool, family: frozenset[str], n: int) -> list[float]:
    """Take a kept worker for a cell, n times over: unpark it and see it answer."""
    worker = await pool.fork_worker(family)
    times = []
    for _ in range(n):
        await pool.park(worker, None)
        start = time.perf_counter()
        await pool.unpark(worker, None)
        await worker.send(Load())
        assert isinstance(await worker.recv(), Loaded)
        times.append(time.perf_counter() - start)
    await worker.close()
    return times


async def _cool_resumes(pool: Pool, family: frozenset[str], n: int) -> list[float]:
    """Dump one worker to disk and restore it, n times over (the resume half is timed)."""
    worker = await pool.fork_worker(family)
    times = []
    for _ in range(n):
        image = await lifecycle.cool(pool, worker)
        start = time.perf_counter()
        worker = await lifecycle.thaw(pool, image)
        times.append(time.perf_counter() - start)
    await worker.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", default="torch")
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=4)
    args = parser.parse_args()
    modules = args.modules.split(",")
    cold_times = cold(modules, args.n)
    results = asyncio.run(warm(modules, args.n, args.concurrent))
    c = statistics.median(cold_times)
    print(f"family {','.join(modules)}: zygote built once in {results['zygote built']:.3f} s",
          end="")
    if "template built" in results:
        print(f", template built once in {results['template built']:.3f} s "
              f"({results.get('template bytes', 0) / 2**20:.0f} MiB of images)", end="")
    print()
    print(f"{'start':<40} {'median s':>9} {'min s':>8} {'vs cold':>8}")
    rows = [("cold interpreter + imports", cold_times),
            ("fork from family zygote (hello)", results["fork"]),
            ("warm: the kept worker, ready", results["warm"]),
            ("template restore (hello)", results.get("template")),
            (f"{args.concurrent} template restores at once, per worker", results.get("concurrent")),
            ("cool resume of a dumped worker (hello)", results.get("cool"))]
    for name, times in rows:
        if times is None:
            why = results.get("template error") or criu.unavailable()
            print(f"{name:<40} {'-':>9} {'-':>8} {'-':>8}  ({why})")
            continue
        m = statistics.median(times)
        print(f"{name:<40} {m:>9.4f} {min(times):>8.4f} {c / m:>7.1f}x")


if __name__ == "__main__":
    main()

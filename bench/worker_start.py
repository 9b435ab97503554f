"""Warm worker start vs a cold interpreter, measured in one run.

Prints, for an import family (default: torch), the median time to
  cold:  `python -c "import <modules>"` (what a fresh kernel pays before any cell),
  fork:  a worker forked from a zygote that has imported the family, until it says hello,
and the ratio between them. Usage: python bench/worker_start.py [--modules torch,numpy] [-n 10]
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

from fabric.pool import Pool


def cold(modules: list[str], n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import " + ", ".join(modules)], check=True)
        times.append(time.perf_counter() - start)
    return times


async def warm(modules: list[str], n: int) -> tuple[list[float], float]:
    with tempfile.TemporaryDirectory() as store:
        pool = Pool(Path(store))
        await pool.start()
        try:
            start = time.perf_counter()
            await pool.zygote_for(frozenset(modules))
            family = time.perf_counter() - start
            times = []
            for _ in range(n):
                start = time.perf_counter()
                worker = await pool.fork_worker(frozenset(modules))
                times.append(time.perf_counter() - start)
                await worker.close()
            return times, family
        finally:
            await pool.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", default="torch")
    parser.add_argument("-n", type=int, default=10)
    args = parser.parse_args()
    modules = args.modules.split(",")
    cold_times = cold(modules, args.n)
    warm_times, family = asyncio.run(warm(modules, args.n))
    c, w = statistics.median(cold_times), statistics.median(warm_times)
    print(f"family {','.join(modules)}: zygote built once in {family:.3f} s")
    print(f"{'start':<34} {'median s':>9} {'min s':>8}")
    print(f"{'cold interpreter + imports':<34} {c:>9.4f} {min(cold_times):>8.4f}")
    print(f"{'fork from family zygote (hello)':<34} {w:>9.4f} {min(warm_times):>8.4f}")
    print(f"warm worker start is {c / w:.0f}x faster than a cold start")


if __name__ == "__main__":
    main()

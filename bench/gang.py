"""Mixed gang sizes on one host: how long 1-, 4- and 8-GPU cells wait for their slots.

Drives the real `Leases` of an `--slots`-slot host (8 by default) with asyncio: cells arrive
at random (Poisson, at `--load` of what the slots can serve), each asking for 1, 4 or 8 slots
in the proportions of the production trace's GPU counts (`--trace`, its `num_gpu` column), and
holds them for a simulated run (no server: only the queue is measured). Each cell belongs to
one of nine sessions (a size, and a typical cell length: short, medium or long), whose recent
runs are the estimates backfill goes by. The same arrivals run twice in one process: under the
fabric's policy (reservation, backfill, aging: `fabric.pool.queueing`) and under plain first
come, first served (no request ever passes an earlier one). Prints waits by size (mean, p95,
max, in seconds) and the slots' utilization for each.
Usage: python bench/gang.py [--requests 400] [--slots 8] [--unit 0.005] [--load 0.6]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fabric.pool import Leases

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "sensei_june_60sec.csv"
TYPICAL = (2.0, 5.0, 20.0)  # a session's typical cell, in units
JITTER = (0.5, 1.0, 1.0, 2.0)  # how far one cell strays from its session's typical length


@dataclass(frozen=True)
class Cell:
    session: str
    size: int
    arrival: float  # seconds after the start
    run: float  # seconds


def mix(trace: Path, sizes: tuple[int, ...]) -> dict[int, float]:
    """The share of each of `sizes` among the trace's GPU counts."""
    with trace.open(newline="") as f:
        counts = Counter(int(row["num_gpu"]) for row in csv.DictReader(f))
    total = sum(counts[s] for s in sizes)
    return {s: counts[s] / total for s in sizes}


def cells(shares: dict[int, float], count: int, slots: int, unit: float, load: float,
          seed: int) -> list[Cell]:
    rng = random.Random(seed)
    sizes, weights = list(shares), list(shares.values())
    demand = (sum(s * w for s, w in shares.items()) * statistics.mean(TYPICAL)
              * statistics.mean(JITTER) * unit)  # slot-seconds one cell holds, on average
    out, now = [], 0.0
    for _ in range(count):
        now += rng.expovariate(load * slots / demand)
        size, typical = rng.choices(sizes, weights)[0], rng.randrange(len(TYPICAL))
        out.append(Cell(f"s{size}-{typical}", size, now,
                        TYPICAL[typical] * rng.choice(JITTER) * unit))
    return out


async def drive(plan: list[Cell], slots: int, patience: float) -> tuple[dict, float]:
    """Waits by size, and the slots' utilization, of `plan` under `patience`."""
    leases = Leases(slots, patience=patience)
    waits: dict[int, list[float]] = {}
    start = time.monotonic()

    async def cell(c: Cell) -> None:
        await asyncio.sleep(max(0.0, start + c.arrival - time.monotonic()))
        lease = await leases.acquire(c.session, c.size)
        waits.setdefault(c.size, []).append(lease.waited)
        await asyncio.sleep(c.run)
        leases.release(lease)

    await asyncio.gather(*(cell(c) for c in plan))
    used = sum(leases.seconds.values())
    return waits, used / (slots * (time.monotonic() - start))


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--unit", type=float, default=0.005, help="seconds of one time unit")
    parser.add_argument("--load", type=float, default=0.6)
    parser.add_argument("--patience", type=float, default=100.0, help="aging, in units")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", type=Path, default=TRACE)
    args = parser.parse_args()
    shares = mix(args.trace, (1, 4, 8))
    plan = cells(shares, args.requests, args.slots, args.unit, args.load, args.seed)
    print(f"{args.requests} cells on {args.slots} slots at {args.load:.0%} load; sizes as in "
          f"{args.trace.name}: " + ", ".join(f"{s} GPU {w:.1%}" for s, w in shares.items()))
    print(f"cell lengths {min(c.run for c in plan):.3f}-{max(c.run for c in plan):.3f} s; "
          f"aging after {args.patience * args.unit:.2f} s")
    print(f"{'policy':<22} {'size':>4} {'cells':>5} {'mean s':>8} {'p95 s':>8} {'max s':>8}")
    for name, patience in (("reservation+backfill", args.patience * args.unit),
                           ("plain FCFS", 0.0)):
        waits, utilization = asyncio.run(drive(plan, args.slots, patience))
        for size in sorted(waits):
            w = waits[size]
            print(f"{name:<22} {size:>4} {len(w):>5} {statistics.mean(w):>8.3f} "
                  f"{p95(w):>8.3f} {max(w):>8.3f}")
        every = [x for w in waits.values() for x in w]
        print(f"{name:<22} {'all':>4} {len(every):>5} {statistics.mean(every):>8.3f} "
              f"{p95(every):>8.3f} {max(every):>8.3f}   utilization {utilization:.0%}")


if __name__ == "__main__":
    main()

"""Many sessions on few slots: does every cell complete, how long does one wait, is it fair?

Starts a local server (its own store, an ipc socket, `--slots` CPU slots, no warm workers kept,
so memory stays bounded whatever `--sessions` is) and runs `--sessions` sessions at once, each
on its own client thread executing `--cells` short cells back to back. Prints completion
(cells that ran ok of all), the longest wait for a lease and for the first line of user code,
and Jain's fairness index of the sessions' throughputs (cells per second of each session's
wall time: 1.0 when every session got the same share, 1/n when one got everything).
Usage: python bench/load.py [--sessions 50] [--slots 2] [--cells 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from fabric.client import Client
from fabric.config import Config
from fabric.embedded import EmbeddedServer
from fabric.errors import FabricError

CELL = "total = sum(i * i for i in range(100_000))\nsteps = steps + 1 if 'steps' in dir() else 1"


def session(address: str, name: str, cells: int, workdir: str, out: dict) -> None:
    """Run `cells` cells in session `name`; record each reply's timings, or the error."""
    replies, errors = [], []
    start = time.monotonic()
    with Client(address, timeout=600) as client:
        try:
            client.call("open", session=name, cwd=workdir)
            for _ in range(cells):
                reply = client.call("execute", timeout=600, session=name, source=CELL)
                replies.append(reply)
            client.call("close", session=name)
        except FabricError as exc:
            errors.append(f"{exc.kind}: {exc.message}")
    out[name] = {"replies": replies, "errors": errors, "wall": time.monotonic() - start}


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--cells", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llf-load-") as tmp:
        config = Config(store=Path(tmp) / "store", runtime_dir=Path(tmp),
                        bind=f"ipc://{tmp}/s.sock")
        env = {**os.environ, "LLFABRIC_SLOTS": str(args.slots), "LLFABRIC_KEEP_WARM": "0"}
        results: dict[str, dict] = {}
        with EmbeddedServer(config, env):
            threads = [threading.Thread(target=session, args=(
                config.address, f"load-{i}", args.cells, tmp, results))
                for i in range(args.sessions)]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - started
    replies = [r for res in results.values() for r in res["replies"]]
    ok = sum(r.status == "ok" for r in replies)
    total = args.sessions * args.cells
    errors = [e for res in results.values() for e in res["errors"]]
    queue = max((r.timings["queue"] for r in replies), default=0.0)
    delay = max((r.timings["visible_delay"] for r in replies), default=0.0)
    rates = [len(res["replies"]) / res["wall"] for res in results.values()]
    print(f"{args.sessions} sessions x {args.cells} cells on {args.slots} slots in "
          f"{elapsed:.1f} s")
    print(f"completion: {ok}/{total} cells ok, {len(errors)} sessions failed"
          + (f" (first: {errors[0]})" if errors else ""))
    print(f"max wait: {queue:.2f} s for a lease, {delay:.2f} s from execute to user code")
    print(f"Jain fairness of per-session throughput: {jain(rates):.3f}")


if __name__ == "__main__":
    main()

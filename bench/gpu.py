"""The GPU path, against baselines measured on the same GPU in the same run.

  start     cold `python -c "import torch; torch.cuda.init(); torch.empty(1, device='cuda')"`
            vs a worker forked from the torch zygote until its first CUDA tensor exists (GPU
            hosts fork their workers: CUDA cannot initialize in a template copy's namespace)
  park      per size of a process's CUDA tensors, three ways to take them off the GPU and put
            them back, each as GB/s and as a share of a pinned host-to-device copy of the same
            bytes, and the next cell's delay (from its lease to the first kernel on its state):
              torch   the worker moves its storages to pinned host memory itself, the driver
                      checkpoints the rest (its context): what parking does by default
              driver  the driver's checkpoint alone (lock + checkpoint, restore + unlock): the
                      fallback, where the worker cannot account for its device memory
              store   saved to the store (device to pinned host, hash, chunk, write) and loaded
                      back onto the GPU (read, verify, pinned staging, host to device): a cold
                      worker's way; its fork and CUDA init (the start table) come on top
            the process checks its memory is intact after each

Needs an NVIDIA GPU and a CUDA build of torch, and parking a CUDA checkpoint driver (cuda-python
with driver >= 570, or `cuda-checkpoint`) whose API answers for a live CUDA process; a row that
cannot run says why. `--budget` seconds: a driver row that would not fit in what is left (at the
speed it showed for a smaller size) is left out and says so.
Without a GPU it says so and exits 0. `--about` prints only what the host offers the GPU path.
Usage: python bench/gpu.py [--about] [-n 3] [--sizes 1,4,10] [--budget 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import psutil

from fabric.errors import FabricError
from fabric.pool import Pool, criu, gpus
from fabric.pool.cuda import CudaError, Driver, ProcessState, find_driver
from fabric.pool.parking import resume, suspend
from fabric.worker.messages import Done, RunCell

GIB = 1 << 30
PROBE_WAIT = 30.0  # seconds the checkpoint API has to answer the probe
FIRST_TENSOR = "import torch; torch.empty(1, device='cuda')"
COLD = "import torch; torch.cuda.init(); torch.empty(1, device='cuda')"

# Holds `size` bytes of device memory filled with a pattern. Each stdin line: "off" moves its
# storages off the GPU (`worker.parking`) and prints what moved; "back" puts them back, and
# "check" does not; both then use the memory in a kernel, as a next cell would, and print
# whether it is intact and the seconds the move back took.
HOLDER = r"""
import json, sys, torch
from fabric.worker.parking import Storages
size = int(sys.argv[1])
x = torch.full((size,), 7, dtype=torch.uint8, device="cuda")
x[::4096] = 1  # a pattern, not what fresh or zeroed memory would hold
expected = int(x.sum(dtype=torch.int64))
torch.cuda.synchronize()
storages = Storages()
print("ready", flush=True)
for line in sys.stdin:
    if line == "off\n":
        moved = storages.park()
        print(json.dumps({"moved": moved.moved, "left": moved.left, "fallback": moved.fallback}),
              flush=True)
        continue
    seconds = storages.resume() if line == "back\n" else 0.0
    intact = int(x.sum(dtype=torch.int64)) == expected
    print("intact" if intact else "corrupt", seconds, flush=True)
"""
ROOT = Path(__file__).resolve().parent.parent


def why_not() -> str | None:
    """Why this host cannot run the GPU benchmark, or None."""
    if not gpus.discover():
        return "no NVIDIA GPU (NVML finds none)"
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def checkpoint_probe(driver: Driver) -> str | None:
    """Why the driver's checkpoint API does not answer for a live CUDA process, or None."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(1 << 20)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        started, _, _ = select.select([child.stdout], [], [], 120)
        if not started or child.stdout.readline() != "ready\n":
            return "a process could not create a CUDA context within 120 s"
        answer: dict[str, object] = {}

        def ask() -> None:
            try:
                answer["state"] = driver.state(child.pid)
            except (CudaError, ValueError, TypeError) as exc:  # refused, or an unknown state
                answer["error"] = f"{type(exc).__name__}: {exc}"

        # a driver that never answers must not hold up what the check still has to run
        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(PROBE_WAIT)
        if "error" in answer:
            return str(answer["error"])
        if "state" not in answer:
            return f"cuCheckpointProcessGetState gave no answer within {PROBE_WAIT:.0f} s"
        if answer["state"] is not ProcessState.RUNNING:
            return f"cuCheckpointProcessGetState says {answer['state']} for a running process"
        return None
    finally:
        child.kill()
        child.wait()


def usable_driver() -> tuple[Driver | None, str]:
    """The checkpoint driver if its API answers, and a line saying which, or why none."""
    driver = find_driver()
    if driver is None:
        return None, "none (neither cuda-python with driver >= 570 nor cuda-checkpoint)"
    name = type(driver).__name__
    if why := checkpoint_probe(driver):
        return None, f"{name}, but its API does not answer: {why}"
    return driver, f"{name}, answers (cuCheckpointProcessGetState: RUNNING)"


def about() -> None:
    """What this host offers the GPU path, a line each (bench/device_check.sh keys on them)."""
    print(f"python: {sys.version.split()[0]} ({sys.executable})")
    try:
        import torch
    except ImportError as exc:
        print(f"torch: not importable ({exc})")
    else:
        print(f"torch: {torch.__version__} (CUDA {torch.version.cuda})")
    found = gpus.discover()
    if found:
        import pynvml

        version = pynvml.nvmlSystemGetDriverVersion()  # bytes from older nvidia-ml-py
        version = version.decode() if isinstance(version, bytes) else version
        print(f"NVML: driver {version}; " + "; ".join(
            f"{g.name} {g.memory_total / GIB:.0f} GiB" for g in found))
    else:
        print("NVML: no NVIDIA GPU")
    if why := why_not():
        print(f"checkpoint API: not tried ({why})")
    else:
        print(f"checkpoint API: {usable_driver()[1]}")
    try:
        import pycriu
    except ImportError as exc:
        print(f"pycriu: not importable ({exc})")
    else:
        print(f"pycriu: {pycriu.__version__} ({Path(pycriu.__file__).parent})")
    print(f"templates: {criu.unavailable() or 'available'}")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def copies(nbytes: int, n: int) -> tuple[float, float]:
    """Median seconds of a pinned device-to-host and host-to-device copy of `nbytes`."""
    import torch

    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def copy(dst: torch.Tensor, src: torch.Tensor) -> float:
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    down = statistics.median(copy(host, device) for _ in range(n))
    up = statistics.median(copy(device, host) for _ in range(n))
    del device, host
    torch.cuda.empty_cache()
    return down, up


def cold_starts(n: int) -> list[float]:
    return [timed(lambda: subprocess.run([sys.executable, "-c", COLD], check=True))
            for _ in range(n)]


async def fork_starts(n: int) -> list[float]:
    """A worker forked from the torch zygote until its first CUDA tensor exists, n times (the
    zygote built first): what a GPU host's cell that no draft prepared waits for."""
    with tempfile.TemporaryDirectory() as store:
        pool = Pool(Path(store), worker_source="zygote")
        await pool.start()
        try:
            await pool.zygote_for(frozenset({"torch"}))
            times = []
            for _ in range(n):
                start = time.perf_counter()
                worker = await pool.new_worker(frozenset({"torch"}))
                await worker.send(RunCell(FIRST_TENSOR, 1))
                while not isinstance(done := await worker.recv(timeout=120), Done):
                    pass
                times.append(time.perf_counter() - start)
                await worker.close()
                if done.status != "ok":
                    raise RuntimeError(f"the forked worker's first CUDA tensor: {done.ename}")
            return times
        finally:
            await pool.stop()


class Holder:
    """A process holding `nbytes` of device memory (HOLDER), asked one line at a time."""

    def __init__(self, nbytes: int) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", HOLDER, str(nbytes)], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.process.pid
        if self.process.stdout.readline() != "ready\n":
            self.close()
            raise RuntimeError(f"the process holding {nbytes} bytes did not start")

    def ask(self, line: str) -> str:
        self.process.stdin.write(f"{line}\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def use(self, line: str) -> float:
        """`line` ("back" or "check"), then the next cell's kernel on the memory, which must
        find it intact; the seconds the move back took."""
        verdict, _, seconds = self.ask(line).partition(" ")
        if verdict != "intact":
            raise RuntimeError(f"device memory after resume: {verdict or 'gone'}")
        return float(seconds)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


class Row(NamedTuple):
    """Median seconds to park, to resume, and from the lease to the next cell's first kernel."""

    park: float
    resume: float
    next_cell: float
    note: str = ""


def torch_parking(holder: Holder, driver: Driver | None, n: int) -> Row:
    """The holder moves its storages off, the driver (if any) checkpoints the rest; back."""
    parks, resumes, delays, moved = [], [], [], {}
    for _ in range(n):
        start = time.perf_counter()
        moved = json.loads(holder.ask("off"))
        if moved["fallback"]:
            raise RuntimeError(f"it moved nothing: {moved['fallback']}")
        if driver is not None:
            try:
                suspend(driver, holder.pid)
            except FabricError:
                holder.use("back")  # as parking does: nothing left half parked
                raise
        parks.append(time.perf_counter() - start)
        start = time.perf_counter()
        if driver is not None:
            resume(driver, holder.pid)
        restored = time.perf_counter() - start
        resumes.append(restored + holder.use("back"))
        delays.append(time.perf_counter() - start)
    note = (f"moved {moved['moved'] / GIB:.2f} GiB, {moved['left'] / 2**20:.0f} MiB left to "
            "the driver" if driver is not None else "no checkpoint driver: the context stays")
    return Row(statistics.median(parks), statistics.median(resumes), statistics.median(delays),
               note)


def driver_parking(holder: Holder, driver: Driver, n: int) -> Row:
    parks, resumes, delays = [], [], []
    for _ in range(n):
        parks.append(timed(lambda: suspend(driver, holder.pid)))
        start = time.perf_counter()
        resume(driver, holder.pid)
        resumes.append(time.perf_counter() - start)
        holder.use("check")
        delays.append(time.perf_counter() - start)
    return Row(statistics.median(parks), statistics.median(resumes), statistics.median(delays))


def store_parking(nbytes: int, n: int) -> Row:
    """Save CUDA tensors of `nbytes` to a store, load them onto the GPU from a fresh one."""
    import torch

    from fabric.snapshot import Store, dumps, loads

    tensors = {f"t{i}": torch.randn(nbytes // 4 // 4, device="cuda") for i in range(4)}
    saves, loads_, delays = [], [], []
    with tempfile.TemporaryDirectory() as root:
        for i in range(n):
            store = Store(Path(root) / f"s{i}")
            start = time.perf_counter()
            ident = store.put_object(dumps(tensors, {}))
            saves.append(time.perf_counter() - start)
            fresh = Store(Path(root) / f"s{i}")
            start = time.perf_counter()
            back = loads(fresh.get_object(ident), {})
            torch.cuda.synchronize()
            loads_.append(time.perf_counter() - start)
            if not all(torch.equal(back[k], v) for k, v in tensors.items()):
                raise RuntimeError("the tensors came back different")
            delays.append(time.perf_counter() - start)  # the check was the next cell's kernel
            del back
            shutil.rmtree(Path(root) / f"s{i}")
    return Row(statistics.median(saves), statistics.median(loads_), statistics.median(delays))


def fits(sizes: list[float]) -> list[int]:
    """The sizes (GiB) that leave room on the GPU and in host memory: a holder's and the store
    row's tensors on the GPU at once, and their copies in host memory."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    host = psutil.virtual_memory().available
    return [int(s * GIB) for s in sizes if 2 * s * GIB < 0.8 * free and 2 * s * GIB < 0.5 * host]


def park_table(driver: Driver | None, sizes: list[int], n: int, deadline: float | None) -> int:
    """Print the park table; 1 when a row failed (it says how), after the rest still ran."""
    print(f"\n{'park / resume':<14} {'park':>7} {'of H2D':>7} {'resume':>7} {'of H2D':>7} "
          f"{'next cell':>10}\n{'GiB':>6} {'by':<7} {'GB/s':>7} {'':>7} {'GB/s':>7} {'':>7} "
          f"{'s':>10}")
    failed, rate = 0, None  # the driver's seconds per byte (park + resume) at the last size
    for nbytes in sizes:
        down, up = copies(nbytes, n)
        gib, h2d = nbytes / GIB, nbytes / up / 1e9
        print(f"{gib:>6.2f} {'copy':<7} {nbytes / down / 1e9:>7.2f} {'D2H':>7} {h2d:>7.2f} "
              f"{'H2D':>7}  (pinned)")
        try:
            holder = Holder(nbytes)
        except RuntimeError as exc:
            print(f"{gib:>6.2f} FAILED: {exc}")
            return 1
        try:
            for by in ("torch", "store", "driver"):
                if by == "driver" and driver is None:
                    print(f"{gib:>6.2f} {by:<7} (no CUDA checkpoint driver that answers)")
                    continue
                if by == "driver" and deadline is not None and rate is not None and \
                        time.monotonic() + rate * nbytes * n > deadline:
                    print(f"{gib:>6.2f} {by:<7} left out: ~{rate * nbytes * n:.0f} s at the "
                          "speed of the last size, past --budget")
                    continue
                try:
                    row = (torch_parking(holder, driver, n) if by == "torch" else
                           store_parking(nbytes, n) if by == "store" else
                           driver_parking(holder, driver, n))
                except (FabricError, RuntimeError) as exc:
                    print(f"{gib:>6.2f} {by:<7} FAILED: {exc}")
                    failed = 1
                    continue
                if by == "driver":
                    rate = (row.park + row.resume) / nbytes
                print(f"{gib:>6.2f} {by:<7} {nbytes / row.park / 1e9:>7.2f} "
                      f"{up / row.park:>7.1%} {nbytes / row.resume / 1e9:>7.2f} "
                      f"{up / row.resume:>7.1%} {row.next_cell:>10.3f}  {row.note}")
        finally:
            holder.close()
    return failed


def main() -> int:
    """Print the tables; 1 when a row failed (it says how), after the rest still ran."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--sizes", default="1,4,10", help="GiB of device memory to park")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds for the whole run (0: no limit); driver rows that would "
                             "not fit are left out")
    parser.add_argument("--about", action="store_true", help="only what this host offers")
    args = parser.parse_args()
    if args.about:
        about()
        return 0
    if why := why_not():
        print(f"skipped: {why}")
        return 0
    deadline = time.monotonic() + args.budget if args.budget > 0 else None
    import torch

    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__} "
          f"(CUDA {torch.version.cuda})")
    driver, which = usable_driver()
    print(f"checkpoint driver: {which}")

    print(f"\n{'start':<48} {'median s':>9} {'min s':>8} {'vs cold':>8}")
    cold = cold_starts(args.n)
    print(f"{'cold: import torch, CUDA init, first tensor':<48} {statistics.median(cold):>9.3f}"
          f" {min(cold):>8.3f} {'1.0x':>8}")
    failed = 0
    try:
        warm = asyncio.run(fork_starts(args.n))
    except (FabricError, RuntimeError) as exc:
        warm, failed = f"FAILED: {exc}", 1
    name = "zygote fork + CUDA init, first tensor"
    if isinstance(warm, str):
        print(f"{name:<48} {'-':>9} {'-':>8} {'-':>8}  ({warm})")
    else:
        ratio = statistics.median(cold) / statistics.median(warm)
        print(f"{name:<48} {statistics.median(warm):>9.3f} {min(warm):>8.3f} {ratio:>7.1f}x")

    sizes = fits([float(s) for s in args.sizes.split(",")])
    return park_table(driver, sizes, args.n, deadline) or failed


if __name__ == "__main__":
    sys.exit(main())

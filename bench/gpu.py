"""The GPU path, against baselines measured on the same GPU in the same run.

  start     cold `python -c "import torch; torch.cuda.init(); torch.empty(1, device='cuda')"`
            vs a worker forked from the torch zygote until its first CUDA tensor exists (GPU
            hosts fork their workers: CUDA cannot initialize in a template copy's namespace)
  park      per GPU memory size held by a process: checkpoint off the GPU (lock + checkpoint)
            and resume (restore + unlock), vs a pinned device-to-host and host-to-device copy
            of the same bytes; the process checks its memory is intact afterwards
  store     saving CUDA tensors to the store (device to pinned host, hash, chunk, write) and
            loading them back onto the GPU, vs the same pinned copies

Needs an NVIDIA GPU and a CUDA build of torch, and parking a CUDA checkpoint driver (cuda-python
with driver >= 570, or `cuda-checkpoint`) whose API answers for a live CUDA process; a row that
cannot run says why.
Without a GPU it says so and exits 0. `--about` prints only what the host offers the GPU path.
Usage: python bench/gpu.py [--about] [-n 3] [--sizes 0.25,1,4,16] [--store-gb 1]
"""

from __future__ import annotations

import argparse
import asyncio
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from fabric.errors import FabricError
from fabric.pool import Pool, criu, gpus
from fabric.pool.cuda import CudaError, Driver, State, find_driver
from fabric.pool.parking import resume, suspend
from fabric.worker.messages import Done, Run

GIB = 1 << 30
PROBE_WAIT = 30.0  # seconds the checkpoint API has to answer the probe
FIRST_TENSOR = "import torch; torch.empty(1, device='cuda')"
COLD = "import torch; torch.cuda.init(); torch.empty(1, device='cuda')"

# Holds `size` bytes of device memory filled with a pattern; checks it after each stdin line.
HOLDER = r"""
import sys, torch
size = int(sys.argv[1])
x = torch.full((size,), 7, dtype=torch.uint8, device="cuda")
x[::4096] = 1  # a pattern, not what fresh or zeroed memory would hold
expected = int(x.sum(dtype=torch.int64))
torch.cuda.synchronize()
print("ready", flush=True)
for _ in sys.stdin:
    print("intact" if int(x.sum(dtype=torch.int64)) == expected else "corrupt", flush=True)
"""


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
        if answer["state"] is not State.RUNNING:
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
                await worker.send(Run(FIRST_TENSOR, 1))
                while not isinstance(done := await worker.recv(timeout=120), Done):
                    pass
                times.append(time.perf_counter() - start)
                await worker.close()
                if done.status != "ok":
                    raise RuntimeError(f"the forked worker's first CUDA tensor: {done.ename}")
            return times
        finally:
            await pool.stop()


def park_resume(driver: Driver, nbytes: int, n: int) -> tuple[float, float]:
    """Median seconds to park and to resume a process holding `nbytes` of device memory."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(nbytes)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        if child.stdout.readline() != "ready\n":
            raise RuntimeError(f"the process holding {nbytes} bytes did not start")
        parks, resumes = [], []
        for _ in range(n):
            parks.append(timed(lambda: suspend(driver, child.pid)))
            resumes.append(timed(lambda: resume(driver, child.pid)))
            child.stdin.write("check\n")
            child.stdin.flush()
            if (answer := child.stdout.readline()) != "intact\n":
                raise RuntimeError(f"device memory after resume: {answer.strip() or 'gone'}")
        return statistics.median(parks), statistics.median(resumes)
    finally:
        child.kill()
        child.wait()


def store_round_trip(nbytes: int, n: int) -> tuple[float, float]:
    """Median seconds to save CUDA tensors of `nbytes` to a store and load them onto the GPU."""
    import torch

    from fabric.snapshot import Store, dumps, loads

    tensors = {f"t{i}": torch.randn(nbytes // 4 // 4, device="cuda") for i in range(4)}
    saves, loads_ = [], []
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
            del back
    return statistics.median(saves), statistics.median(loads_)


def fits(sizes: list[float]) -> list[int]:
    """The sizes (GiB) that leave room on the GPU and in host memory (a checkpoint's copy)."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    host = psutil.virtual_memory().available
    return [int(s * GIB) for s in sizes if s * GIB < 0.8 * free and s * GIB < 0.5 * host]


def main() -> int:
    """Print the tables; 1 when a row failed (it says how), after the rest still ran."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--sizes", default="0.25,1,4,16", help="GiB of device memory to park")
    parser.add_argument("--store-gb", type=float, default=1.0)
    parser.add_argument("--about", action="store_true", help="only what this host offers")
    args = parser.parse_args()
    if args.about:
        about()
        return 0
    if why := why_not():
        print(f"skipped: {why}")
        return 0
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

    print(f"\n{'park / resume':<12} {'park s':>8} {'D2H copy':>9} {'ratio':>6} "
          f"{'resume s':>9} {'H2D copy':>9} {'ratio':>6}")
    sizes = fits([float(s) for s in args.sizes.split(",")])
    if driver is None:
        print("(no CUDA checkpoint driver that answers: nothing to park)")
    for nbytes in sizes if driver is not None else []:
        down, up = copies(nbytes, args.n)
        try:
            park, back = park_resume(driver, nbytes, args.n)
        except (FabricError, RuntimeError) as exc:
            print(f"{nbytes / GIB:>8.2f} GiB FAILED: {exc}")
            failed = 1
            break  # the larger sizes would fail the same way
        print(f"{nbytes / GIB:>8.2f} GiB {park:>8.3f} {down:>9.3f} {park / down:>5.1f}x "
              f"{back:>9.3f} {up:>9.3f} {back / up:>5.1f}x")

    nbytes = int(args.store_gb * GIB)
    down, up = copies(nbytes, args.n)
    save, load = store_round_trip(nbytes, args.n)
    print(f"\n{'store, CUDA tensors':<24} {'GB/s':>7} {'copy GB/s':>10} {'of copy':>8}")
    for what, ours, copy in (("save (D2H, hash, write)", save, down),
                             ("load (read, verify, H2D)", load, up)):
        print(f"{what:<24} {nbytes / ours / 1e9:>7.2f} {nbytes / copy / 1e9:>10.2f} "
              f"{copy / ours:>7.0%}")
    return failed


if __name__ == "__main__":
    sys.exit(main())

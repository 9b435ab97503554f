"""Completion and inspection latency of the attached kernel vs a plain ipykernel, in one run.

After the same cell in each kernel, sends `complete_request`s and `inspect_request`s as a
frontend does on Tab and Shift+Tab, and prints the median milliseconds from request to reply:
a plain python3 kernel; the "Python 3 (llfabric)" kernel on a server that keeps the session's
worker warm (the worker answers); and on one that keeps none (the head's catalog answers).
Usage: python bench/completion_latency.py [-n 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from jupyter_client import BlockingKernelClient, KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from fabric.attach.kernels import install_kernelspec
from fabric.config import Config
from fabric.embedded import EmbeddedServer

SETUP = ("import numpy as np\n"
         "class Thing:\n"
         "    def method_one(self, a, b=2):\n"
         "        '''Add b to a.'''\n"
         "        return a + b\n"
         "my_unique_var = {'alpha': 1}\n"
         "thing = Thing()\n"
         "data = np.zeros((1000, 100))\n")
REQUESTS = [("complete", "my_uni"), ("complete", "thing.meth"), ("complete", "np.zer"),
            ("inspect", "thing"), ("inspect", "thing.method_one(")]
REPO = Path(__file__).resolve().parent.parent


def _start(name: str, specs: KernelSpecManager, env: dict[str, str],
           workdir: Path) -> tuple[KernelManager, BlockingKernelClient]:
    manager = KernelManager(kernel_name=name, kernel_spec_manager=specs)
    manager.start_kernel(env=env, cwd=str(workdir))
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    client.execute_interactive(SETUP, timeout=300)
    return manager, client


def measure(client: BlockingKernelClient, n: int) -> dict[tuple[str, str], float]:
    """Median milliseconds per request, and a check that each found what it asked."""
    times = {}
    for kind, code in REQUESTS:
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            if kind == "complete":
                reply = client.complete(code, len(code), reply=True, timeout=60)["content"]
                ok = bool(reply["matches"])
            else:
                reply = client.inspect(code, len(code), reply=True, timeout=60)["content"]
                ok = reply["found"]
            samples.append(time.perf_counter() - start)
            if not ok:
                raise RuntimeError(f"{kind} of {code!r} found nothing: {reply}")
        times[kind, code] = 1000 * statistics.median(samples)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50)
    args = parser.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="llf-") as tmp:
        root = Path(tmp)
        install_kernelspec("llfabric-bench", prefix=str(root / "jupyter"))
        specs = KernelSpecManager(kernel_dirs=[str(root / "jupyter/share/jupyter/kernels")])
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        manager, client = _start("python3", KernelSpecManager(), dict(os.environ), root)
        try:
            results["plain"] = measure(client, args.n)
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
        for tier, keep in (("warm", "600"), ("cold", "0")):
            config = Config(store=root / f"store-{tier}", runtime_dir=root / tier,
                            bind=f"ipc://{root}/{tier}.sock")
            env = {**os.environ, "PYTHONPATH": path, "LLFABRIC_BIND": config.address,
                   "LLFABRIC_KEEP_WARM": keep, "LLFABRIC_SESSION": f"b-{uuid.uuid4().hex[:8]}"}
            (root / tier).mkdir(mode=0o700)
            with EmbeddedServer(config, env=env):
                manager, client = _start("llfabric-bench", specs, env, root)
                try:
                    results[tier] = measure(client, args.n)
                finally:
                    client.stop_channels()
                    manager.shutdown_kernel(now=True)
    print(f"milliseconds from request to reply, median of {args.n}")
    print(f"{'request':28} {'plain':>7} {'warm':>7} {'ratio':>6} {'cold':>7} {'ratio':>6}")
    for kind, code in REQUESTS:
        plain, warm, cold = (results[k][kind, code] for k in ("plain", "warm", "cold"))
        print(f"{kind + ' ' + code:28} {plain:7.1f} {warm:7.1f} {warm / plain:6.1f} "
              f"{cold:7.1f} {cold / plain:6.1f}")


if __name__ == "__main__":
    main()

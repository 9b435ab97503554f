"""Cell latency in a Jupyter kernel attached to llfabric vs a plain ipykernel, measured in one run.

Runs the same short notebook in a plain python3 kernel and in the "Python 3 (llfabric)" kernel
(against an embedded server), sending each execute request with its cell id as JupyterLab does,
so the attached kernel drafts the next cell while the "user" thinks for `--think` seconds.
Prints the median seconds from execute request to reply per cell, and the ratio to plain; then
the kernel's start (to its first kernel_info reply: Idle in JupyterLab), a Restart Kernel (a
`shutdown_request` with `restart`, to the new kernel's reply) and a trivial cell's round trip,
against the targets: start at most 1.3x plain, restart 1.5x, a trivial cell plain + 30 ms.
Usage: python bench/attach_latency.py [--think 1.0] [-n 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from fabric.attach.kernels import install_kernelspec
from fabric.config import Config
from fabric.embedded import EmbeddedServer

CELLS = ["import numpy as np", "a = np.arange(1_000_000)", "b = float(a.sum())",
         "c = a[::2].copy()", "print(b, c.size)"]
REPO = Path(__file__).resolve().parent.parent
TRIVIAL = "1"
TRIVIAL_RUNS = 5


def execute(client: Any, source: str, cell_id: str | None = None) -> float:
    """Seconds from an execute request to its reply."""
    message = client.session.msg("execute_request", {
        "code": source, "silent": False, "store_history": True,
        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
    if cell_id is not None:
        message["metadata"]["cellId"] = cell_id
    start = time.perf_counter()
    client.shell_channel.send(message)
    while True:
        reply = client.get_shell_msg(timeout=300)
        if reply["parent_header"]["msg_id"] == message["header"]["msg_id"]:
            break
    elapsed = time.perf_counter() - start
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"cell {source!r} failed: {reply['content']}")
    return elapsed


def ready(manager: KernelManager) -> Any:
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    return client


def run(kernel_name: str, specs: KernelSpecManager, env: dict[str, str], workdir: Path,
        think: float) -> tuple[list[float], dict[str, float]]:
    """Each cell's seconds, and the kernel's `start`, `restart` and `trivial` seconds."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nbformat.write(nb, str(workdir / "bench.ipynb"))
    manager = KernelManager(kernel_name=kernel_name, kernel_spec_manager=specs)
    start = time.perf_counter()
    manager.start_kernel(env={**env, "JPY_SESSION_NAME": "bench.ipynb"}, cwd=str(workdir))
    client = ready(manager)
    kernel = {"start": time.perf_counter() - start}
    try:
        times = []
        for cell in nb.cells:
            times.append(execute(client, cell.source, cell.id))
            time.sleep(think)
        kernel["trivial"] = statistics.median(execute(client, TRIVIAL)
                                              for _ in range(TRIVIAL_RUNS))
        client.stop_channels()
        start = time.perf_counter()
        manager.restart_kernel()
        client = ready(manager)
        kernel["restart"] = time.perf_counter() - start
        return times, kernel
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--think", type=float, default=1.0)
    parser.add_argument("-n", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llf-") as tmp:
        tmp_path = Path(tmp)
        install_kernelspec("llfabric-bench", prefix=str(tmp_path / "jupyter"))
        specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "jupyter/share/jupyter/kernels")])
        config = Config(store=tmp_path / "store", runtime_dir=tmp_path,
                        bind=f"ipc://{tmp_path}/s.sock")
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "LLFABRIC_BIND": config.address}
        plain, attached = [], []
        with EmbeddedServer(config):
            for i in range(args.n):
                work = tmp_path / f"w{i}"
                work.mkdir()
                plain.append(run("python3", KernelSpecManager(), env, work, args.think))
                env["LLFABRIC_SESSION"] = f"bench-{uuid.uuid4().hex[:8]}"
                attached.append(run("llfabric-bench", specs, env, work, args.think))
    print(f"seconds from execute request to reply, median of {args.n} runs, "
          f"think time {args.think} s")
    print(f"{'cell':28} {'plain':>8} {'attached':>9} {'ratio':>6}")
    for index, source in enumerate(CELLS):
        p = statistics.median(cells[index] for cells, _ in plain)
        a = statistics.median(cells[index] for cells, _ in attached)
        print(f"{source[:28]:28} {p:8.3f} {a:9.3f} {a / p:6.1f}")
    print(f"\nthe kernel, seconds, median of {args.n} runs")
    print(f"{'':28} {'plain':>8} {'attached':>9} {'ratio':>6}  target")
    for key, target in (("start", "<= 1.3x"), ("restart", "<= 1.5x"),
                        ("trivial", "<= plain + 0.030 s")):
        p = statistics.median(kernel[key] for _, kernel in plain)
        a = statistics.median(kernel[key] for _, kernel in attached)
        print(f"{key:28} {p:8.3f} {a:9.3f} {a / p:6.1f}  {target}")


if __name__ == "__main__":
    main()

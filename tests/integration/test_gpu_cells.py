"""The GPU path end to end, on a real GPU, against a real `llfabric serve`: NVML is the judge of
which processes hold the GPU and how much of its memory.

  - a template copy carries the CUDA context its dormant worker created, parked off the GPU
    until its cell's lease, and a prepared (drafted) cell runs on it at once;
  - a kept worker that trains a model is parked between cells (NVML: no GPU memory), resumed,
    and goes on training with bit-identical results to a run that was never parked;
  - CUDA tensors go through the store and come back on a fresh worker, values and dtypes equal;
  - leases match NVML: the only processes of the server holding a GPU are the workers running
    a cell under a lease, on the leased GPU;
  - a warm worker (the default) leaves the GPU between cells and keeps its CUDA tensors, and on
    a two-GPU host, one parked off a busy GPU resumes on the free one;
  - on two GPUs, a `DataParallel` cell's worker is parked off both and resumed on both, and
    goes on training bit-identically to a run never parked.

`pytest -m gpu`; every test skips with its reason on a host without an NVIDIA GPU and a CUDA
build of torch (templates also need CRIU, parking a CUDA checkpoint driver).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from helpers import RunningServer, execute, open_session, serving, session_status, text

from fabric.client import Client
from fabric.messages import Output, Reply
from fabric.pool import gpus
from fabric.pool.cuda import find_driver

pytestmark = pytest.mark.gpu

NO_DRIVER = ("no CUDA checkpoint driver (cuda-python with driver >= 570, or cuda-checkpoint): "
             "CRIU cannot dump a CUDA context, and kept workers stay on their GPU")

# cuBLAS is bitwise reproducible run to run only with a fixed workspace configuration
ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

SETUP = """\
import torch
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                            torch.nn.Linear(64, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
def batches():
    gen = torch.Generator(device="cuda").manual_seed(1)
    while True:
        x = torch.randn(256, 16, device="cuda", generator=gen)
        yield x, x.sin().sum(1, keepdim=True)
data = batches()  # a live generator: it cannot be saved, so the session keeps this worker
losses = []
"""

TRAIN = """\
for _ in range(25):
    x, y = next(data)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
del x, y, loss
"""

REPORT = """\
print(repr(losses))
print(repr(torch.cat([p.detach().flatten() for p in model.parameters()]).cpu().tolist()))
"""

DIGEST = """\
import hashlib
def digest(tensors):
    return {k: (str(v.dtype), str(v.device), v.shape,
                hashlib.sha256(bytes(v.cpu().contiguous().view(torch.uint8).flatten().tolist()))
                .hexdigest()) for k, v in tensors.items()}
"""


def hold(flag: Path) -> str:
    """Cell source that says `holding` and waits until the test creates `flag`."""
    return (f"import os as _os, time as _time\nprint('holding', flush=True)\n"
            f"while not _os.path.exists({str(flag)!r}):\n    _time.sleep(0.01)\n")


@pytest.fixture(scope="module")
def devices() -> list[gpus.Gpu]:
    found = gpus.discover()
    if not found:
        pytest.skip("no NVIDIA GPU (NVML finds none)")
    import torch  # not torch.cuda: this process must hold no CUDA context of its own

    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU build")
    return found


@pytest.fixture(scope="module")
def server(devices, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # keep_warm=0: a session's worker is kept only while it holds unsaved state (pinned), so
    # the other cells start on fresh workers or template copies and load from the store
    # linger=0: a kept worker is parked as soon as its cell is saved
    with serving(tmp_path_factory.mktemp("store"), {**os.environ, **ENV}, keep_warm=0,
                 linger=0) as running:
        yield running


@pytest.fixture
def client(server: RunningServer) -> Iterator[Client]:
    with server.client(timeout=120) as c:
        yield c


def wait_for(check: Callable[[], object], what: str, timeout: float = 180.0) -> object:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.1)
    return found


def gpu_memory() -> dict[int, tuple[str, int | None]]:
    """NVML's view: pid -> (GPU UUID, bytes of its memory; None where NVML cannot say) for
    every process that holds a CUDA context on any GPU."""
    import pynvml

    pynvml.nvmlInit()
    held = {}
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid_ = gpus._text(pynvml.nvmlDeviceGetUUID(handle))
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            held[proc.pid] = (uuid_, proc.usedGpuMemory)
    return held


def tree(pid: int) -> set[int]:
    """`pid` and its descendants (a template copy's worker runs under its llfabric-init)."""
    try:
        return {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def holders(pids: set[int]) -> dict[int, tuple[str, int | None]]:
    """Those of `pids` that hold GPU memory now, as NVML shows."""
    return {pid: v for pid, v in gpu_memory().items() if pid in pids and v[1] != 0}


def stdout(outputs: list[dict]) -> str:
    return "".join(o["text"] for o in outputs
                   if o["output_type"] == "stream" and o["name"] == "stdout")


def run_holding(server: RunningServer, session: str, source: str, flag: Path,
                while_held: Callable[[], object]) -> tuple[dict, list[dict], object]:
    """Execute `source` (which should `hold(flag)`); once it says `holding`, call `while_held`
    and then let the cell go on. Returns the reply, the outputs after `holding`, and what
    `while_held` returned."""
    outputs, reply, seen = [], {}, None
    with server.client(timeout=300) as client:
        try:
            for message in client.execute(session, source, timeout=300):
                if isinstance(message, Output):
                    if text([message.output]) == "holding\n" and seen is None:
                        seen = (while_held(),)
                        flag.touch()
                    else:
                        outputs.append(message.output)
                elif isinstance(message, Reply):
                    reply = message.to_map()
        finally:
            flag.touch()  # never leave the cell waiting, whatever failed
    assert seen is not None, text(outputs)
    return reply, outputs, seen[0]


def test_a_prepared_cell_holds_no_gpu_until_its_lease_and_then_runs_on_it(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    session = open_session(client, tmp_path)
    reply, outputs = execute(client, session, "import torch\nx = torch.ones(4, device='cuda')")
    assert reply["status"] == "ok", outputs
    assert client.status().worker_source == "zygote"  # templates cannot carry CUDA

    cell = "print(torch.cuda.current_device(), (x * 2).sum().item())"
    client.call("draft", session=session, source=cell)
    worker = wait_for(lambda: session_status(client, session).worker, "the drafted worker")
    time.sleep(2)  # a load that went ahead of the lease would have made its CUDA context
    assert not holders(tree(worker)), "a prepared worker not yet leased must hold no GPU"
    sent, first_output, outputs = time.monotonic(), None, []
    for message in client.execute(session, cell, timeout=120):
        if isinstance(message, Output):
            first_output = first_output or time.monotonic()
            outputs.append(message.output)
        elif isinstance(message, Reply):
            reply = message.to_map()
    assert (reply["path"], reply["source"]) == ("draft", "zygote")
    assert text(outputs) == "0 8.0\n"
    # the visible delay (the lease, the state's load onto the GPU) is what the user waited for,
    # no more: the preparation before execute is not in it
    timings = reply["timings"]
    assert timings["prepare"] > 0 and 0 <= timings["visible_delay"] <= first_output - sent
    print(f"prepared cell: visible delay {timings['visible_delay']:.3f} s, "
          f"prepared in {timings['prepare']:.3f} s before execute")  # device_check.sh shows it


def gpus_held(pids: set[int]) -> set[str]:
    """The GPUs on which any of `pids` holds memory now (one process may hold several)."""
    import pynvml

    pynvml.nvmlInit()
    held = set()
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        if any(p.pid in pids and p.usedGpuMemory != 0
               for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)):
            held.add(gpus._text(pynvml.nvmlDeviceGetUUID(handle)))
    return held


def _trains_parked_and_resumed(server: RunningServer, client: Client, tmp_path: Path,
                               setup: str, count: int) -> None:
    """A kept worker trains on `count` GPUs, is parked off all of them between cells, resumed
    on all of them for the next, and ends bit-identical to a run never parked."""
    session = open_session(client, tmp_path)
    reply, outputs = execute(client, session, setup + TRAIN, gpus=count)
    assert reply["status"] == "ok" and "data" in reply["unsaved"], outputs
    status = session_status(client, session)
    assert status.pinned and status.tier == "warm"
    worker = tree(status.worker)
    assert not gpus_held(worker), "a parked worker holds no GPU memory"

    flag = tmp_path / "go"
    reply, outputs, held = run_holding(server, session, hold(flag) + TRAIN + REPORT, flag,
                                       lambda: gpus_held(worker))
    assert reply["status"] == "ok" and reply["path"] == "pinned", text(outputs)
    assert len(held) == count, "the resumed worker holds its model on its GPUs again"
    assert not gpus_held(worker), "parked again after its cell"

    visible = ",".join(sorted(held))
    reference = subprocess.run([sys.executable, "-c", setup + TRAIN + TRAIN + REPORT],
                               capture_output=True, text=True, timeout=300, check=True,
                               env={**os.environ, **ENV, "CUDA_VISIBLE_DEVICES": visible})
    assert stdout(outputs) == reference.stdout  # 50 losses and every parameter, bit for bit


def test_a_kept_worker_trains_parks_off_the_gpu_resumes_and_matches_an_unparked_run(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    if find_driver() is None:
        pytest.skip(NO_DRIVER)
    _trains_parked_and_resumed(server, client, tmp_path, SETUP, 1)


DATA_PARALLEL = SETUP.replace(".cuda()\n", ".cuda()\nmodel = torch.nn.DataParallel(model)\n", 1)


def test_a_two_gpu_data_parallel_cell_parks_resumes_and_matches_an_unparked_run(
        server: RunningServer, client: Client, devices: list[gpus.Gpu], tmp_path: Path) -> None:
    if len(devices) < 2:
        pytest.skip("a two-GPU cell takes two GPUs")
    if find_driver() is None:
        pytest.skip(NO_DRIVER)
    _trains_parked_and_resumed(server, client, tmp_path, DATA_PARALLEL, 2)


def test_cuda_tensors_through_the_store_come_back_on_a_fresh_worker(
        client: Client, tmp_path: Path) -> None:
    session = open_session(client, tmp_path)
    make = (DIGEST + "gen = torch.Generator(device='cuda').manual_seed(2)\n"
            "base = torch.randn(1 << 16, device='cuda', generator=gen) * 100\n"
            "tensors = {str(d): base.to(d) for d in (torch.float32, torch.float16, "
            "torch.bfloat16, torch.float64, torch.int64, torch.uint8, torch.bool)}\n"
            "tensors['strided'] = tensors['torch.float32'].view(256, 256)[:, ::3]\n"
            "del gen  # a generator object: not what this test is about\n"
            "print(digest(tensors))\n")
    reply, saved = execute(client, session, make)
    assert reply["status"] == "ok" and reply["unsaved"] == [], saved
    reply, loaded = execute(client, session, "print(digest(tensors))")
    assert reply["status"] == "ok" and reply["path"] != "pinned"  # a fresh worker loaded them
    assert stdout(loaded) == stdout(saved)
    assert all(f"'{kind}'" in stdout(saved) for kind in ("cuda:0", "torch.bfloat16", "torch.bool"))


def test_leases_match_which_processes_nvml_sees_on_the_gpu(
        server: RunningServer, client: Client, devices: list[gpus.Gpu], tmp_path: Path) -> None:
    leases = client.status().leases
    assert leases.kind == "gpu" and leases.slots == len(devices)
    assert [s.uuid for s in leases.leases] == [g.uuid for g in devices]
    served = lambda: tree(server.process.pid)  # noqa: E731
    sessions = [open_session(client, tmp_path) for _ in range(2)]
    flags = [tmp_path / f"go{i}" for i in range(2)]
    cell = "import torch\nx = torch.ones(1 << 22, device='cuda')\n"
    holding, release, results = threading.Event(), threading.Event(), {}

    def first_holds() -> None:
        holding.set()
        release.wait(300)

    def second_holds() -> dict:
        # the first cell's worker is retired just after its lease ends: wait until it is gone
        with server.client() as own:  # the main thread's client is busy: one per thread
            mine = tree(session_status(own, sessions[1]).worker)
        return wait_for(lambda: (h := holders(served())) and set(h) <= mine and h,
                        "only the second cell's worker on the GPU", 60)

    def run(i: int, while_held: Callable[[], object]) -> None:
        try:
            results[i] = run_holding(server, sessions[i], cell + hold(flags[i]), flags[i],
                                     while_held)
        except BaseException as exc:
            results[i] = exc
            holding.set()  # a cell that failed before it held must not leave the test waiting
            raise

    threads = [threading.Thread(target=run, args=(0, first_holds))]
    threads[0].start()
    try:
        assert holding.wait(300), "the first cell never started"
        assert not isinstance(results.get(0), BaseException), results[0]
        worker = tree(session_status(client, sessions[0]).worker)
        status = client.status().leases
        held = [s for s in status.leases if s.session is not None]
        assert [s.session for s in held] == [sessions[0]]
        on_gpu = holders(served())
        assert on_gpu and set(on_gpu) <= worker  # the leased worker, and no other of ours
        assert {gpu for gpu, _ in on_gpu.values()} == {held[0].uuid}  # on the leased GPU
        if len(devices) == 1:  # a second session waits for the lease, off the GPU meanwhile
            threads.append(threading.Thread(target=run, args=(1, second_holds)))
            threads[1].start()
            wait_for(lambda: client.status().leases.queued == 1, "a queued cell")
            assert set(holders(served())) <= worker
    finally:
        release.set()
        for thread in threads:
            thread.join(300)
        for flag in flags:
            flag.touch()
    assert all(results[i][0]["status"] == "ok" for i in range(len(threads))), results
    if len(threads) == 2:
        assert results[1][0]["timings"]["queue"] > 0
        assert not set(results[1][2]) & worker
    wait_for(lambda: not holders(served()), "every worker off the GPU once no cell runs", 60)
    status = client.status()
    assert status.leases.held == 0
    assert all(session_status(client, s).lease_seconds > 0 for s in sessions[:len(threads)])


@pytest.fixture(scope="module")
def warm_server(devices, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # every session's worker kept warm between cells (the default), parked as soon as its cell
    # is saved
    with serving(tmp_path_factory.mktemp("warm-store"), {**os.environ, **ENV},
                 linger=0) as running:
        yield running


def test_a_warm_worker_leaves_the_gpu_between_cells_and_keeps_its_tensors(
        warm_server: RunningServer, tmp_path: Path) -> None:
    if find_driver() is None:
        pytest.skip(NO_DRIVER)
    with warm_server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        reply, outputs = execute(client, session, "import torch\n"
                                 "x = torch.arange(1 << 20, device='cuda', dtype=torch.float64)")
        assert reply["status"] == "ok" and reply["unsaved"] == [], outputs
        status = session_status(client, session)
        assert status.tier == "warm" and not status.pinned
        assert not holders(tree(status.worker)), "a parked worker holds no GPU memory"
        (worker,) = [w for w in client.status().workers if w.pid == status.worker]
        # its storages moved by the worker itself, at copy speed; the driver took the rest
        assert worker.parked and worker.fallback is None and worker.moved >= 8 << 20
        assert status.memory >= worker.moved  # its host copies: the host's memory now
        reply, outputs = execute(client, session, "print(x.device.type, int(x.sum().item()))")
        total = (1 << 20) * ((1 << 20) - 1) // 2
        assert (reply["path"], stdout(outputs)) == ("warm", f"cuda {total}\n")
        assert session_status(client, session).worker == status.worker


def test_a_warm_worker_holding_a_cuda_graph_is_parked_whole_by_the_driver(
        warm_server: RunningServer, tmp_path: Path) -> None:
    if find_driver() is None:
        pytest.skip(NO_DRIVER)
    with warm_server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        reply, outputs = execute(client, session, (
            "import torch\nstatic = torch.ones(1 << 20, device='cuda')\n"
            "graph = torch.cuda.CUDAGraph()\nside = torch.cuda.Stream()\n"
            "with torch.cuda.stream(side):\n    static.add_(1)\n"
            "torch.cuda.current_stream().wait_stream(side)\n"
            "with torch.cuda.graph(graph):\n    static.mul_(2)\n"))
        assert reply["status"] == "ok", outputs
        status = session_status(client, session)
        (worker,) = [w for w in client.status().workers if w.pid == status.worker]
        assert worker.parked and worker.moved == 0 and "CUDA graph" in worker.fallback
        assert not holders(tree(status.worker)), "a parked worker holds no GPU memory"
        reply, outputs = execute(client, session, "graph.replay()\nprint(static[0].item())")
        # the graph cannot be saved: the session is pinned to this worker, addresses kept
        assert (reply["path"], stdout(outputs)) == ("pinned", "4.0\n")


def _hold_gpu(server: RunningServer, session: str, flag: Path) -> threading.Thread:
    """Run a cell in `session` that holds a GPU until `flag` exists; return once it holds."""
    holding = threading.Event()
    cell = "import torch\ntorch.ones(1, device='cuda')\n" + hold(flag)

    def until_freed() -> None:
        holding.set()
        wait_for(flag.exists, "the test to free the GPU", timeout=300)

    thread = threading.Thread(target=run_holding, args=(server, session, cell, flag, until_freed))
    thread.start()
    assert holding.wait(180)
    return thread


def test_a_parked_worker_resumes_on_the_gpu_its_next_lease_is_for(
        warm_server: RunningServer, devices: list[gpus.Gpu], tmp_path: Path) -> None:
    if len(devices) != 2:
        pytest.skip("forcing a parked worker onto another GPU takes exactly two GPUs")
    if find_driver() is None:
        pytest.skip(NO_DRIVER)
    with warm_server.client(timeout=300) as client:
        mine, first, second = (open_session(client, tmp_path) for _ in range(3))
        holders_ = [_hold_gpu(warm_server, first, tmp_path / "free-a")]  # GPU a
        reply, outputs = execute(client, mine, "import torch\nx = torch.ones(1 << 20, "
                                 "device='cuda')")  # on GPU b, and parked off it
        assert reply["status"] == "ok", outputs
        worker = session_status(client, mine).worker
        holders_.append(_hold_gpu(warm_server, second, tmp_path / "free-b"))  # now GPU b
        done: dict = {}

        def run_mine() -> None:
            with warm_server.client(timeout=300) as own:
                done["result"] = execute(own, mine, "print(int(x.sum().item()))")

        waiting = threading.Thread(target=run_mine)
        waiting.start()
        wait_for(lambda: client.status().leases.queued, "the cell to queue")
        (tmp_path / "free-a").touch()  # GPU a comes free: the parked worker must move there
        waiting.join(300)
        (tmp_path / "free-b").touch()
        for holder in holders_:
            holder.join(300)
        reply, outputs = done["result"]
        assert reply["status"] == "ok" and stdout(outputs) == f"{1 << 20}\n", text(outputs)
        if reply["path"] == "warm":  # moved with the driver's GPU pairs, tensors and all
            assert session_status(client, mine).worker == worker
        else:  # a driver that cannot move it: a fresh worker loaded x from the store
            assert reply["path"] == "cold"

"""A worker's own move of its torch storages off the device and back (`fabric.worker.parking`),
on CPU storages: the walk, the release and the copy-back that move CUDA storages on a GPU host.

Each scenario runs in a fresh process, as a worker is one: the walk takes every tensor of the
process, and this one's (pytest's, other tests') are none of its business. The same scenarios
run on CUDA storages with `pytest -m gpu`, with NVML as the judge of what a parked process holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

TRAIN = """
import gc, json, sys, torch
from fabric.worker.parking import Storages
device = sys.argv[1]
torch.use_deterministic_algorithms(True)

def used():  # NVML: bytes of GPU memory this process holds (its context included)
    import os, pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return next((p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                 if p.pid == os.getpid()), 0)

def run(park):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 1)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 8, device=device), torch.randn(64, 1, device=device)
    # on a GPU 1 GiB, which NVML must see go
    ballast = torch.ones(1 << 28 if device == "cuda" else 1 << 16, device=device)
    losses = []
    def train(steps):
        for _ in range(steps):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
    train(3)
    weight = model[0].weight
    rows, flat = weight[2:5], weight.detach().view(-1)  # views of the weight's storage
    tensors = [*model.parameters(), *(p.grad for p in model.parameters()),
               *(t for s in opt.state.values() for t in s.values()), rows, flat, x, ballast]
    ids = [id(t) for t in tensors] + [id(weight.untyped_storage())]
    found = {}
    if park:
        storages = Storages(device)
        found["nvml"] = used() if device == "cuda" else 0
        parked = storages.park()
        found["nvml_parked"] = used() if device == "cuda" else 0
        found["left"] = parked.left
        found["moved"] = parked.moved
        found["fallback"] = parked.fallback
        found["held"] = storages.host_bytes
        found["released"] = all(t.untyped_storage().nbytes() == 0 for t in tensors)
        found["again"] = storages.park().moved  # a second park moves nothing more
        storages.resume()
        found["back"] = storages.host_bytes
    found["same"] = ids == [id(t) for t in tensors] + [id(weight.untyped_storage())]
    found["shared"] = (rows.untyped_storage() is weight.untyped_storage()
                       and flat.data_ptr() == weight.data_ptr())
    with torch.no_grad():
        flat[2 * 8] = 42.0  # written through one view, seen through the others
    found["views"] = rows[0, 0].item() == 42.0 == weight[2, 0].item()
    found["bytes"] = sum(t.untyped_storage().nbytes() for t in {
        t.untyped_storage()._cdata: t for t in tensors}.values())
    train(3)  # training goes on: Adam's state, the gradients, the RNG
    found["result"] = [t.tolist() for t in
                       (*losses, *model.parameters(), *opt.state[weight].values(),
                        torch.rand(4), torch.rand(4, device=device))]
    found["ballast"] = ballast.sum().item() == ballast.numel()
    return found

context = torch.empty(1, device=device)  # a CUDA context, and the allocator's first block
print(json.dumps({"context": used() if device == "cuda" else 0,
                  "parked": run(True), "never": run(False)}))
"""

# cuBLAS is bitwise reproducible run to run only with a fixed workspace configuration
ENV = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _run(script: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def trained(request: pytest.FixtureRequest) -> dict:
    if request.param == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip(f"no CUDA device (torch {torch.__version__})")
    return _run(TRAIN, request.param)


def test_every_storage_moves_to_host_memory_and_frees_its_own(trained: dict) -> None:
    parked = trained["parked"]
    assert parked["fallback"] is None and parked["released"]
    assert parked["moved"] == parked["held"] >= parked["bytes"] > 0
    assert parked["again"] == parked["moved"] and parked["back"] == 0


def test_tensors_views_and_optimizer_state_stay_the_same_objects(trained: dict) -> None:
    parked = trained["parked"]
    assert parked["same"] and parked["shared"] and parked["views"]


def test_training_goes_on_bit_identical_to_a_run_whose_storages_never_moved(
        trained: dict) -> None:
    assert trained["parked"]["result"] == trained["never"]["result"]
    assert trained["parked"]["ballast"]


@pytest.mark.gpu
@pytest.mark.parametrize("trained", ["cuda"], indirect=True)
def test_nvml_sees_no_memory_of_a_process_whose_storages_moved_beyond_its_context(
        trained: dict) -> None:
    parked = trained["parked"]
    assert parked["nvml"] >= trained["context"] + (1 << 30)  # before: the ballast is there
    # after: its context, and what only C++ holds (cuBLAS' workspace), which the driver takes
    assert parked["nvml_parked"] <= trained["context"] + parked["left"] + (32 << 20)


@pytest.mark.gpu
def test_a_cuda_graph_leaves_everything_to_the_driver() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip(f"no CUDA device (torch {torch.__version__})")
    found = _run("""
import json, torch
from fabric.worker.parking import Storages
static = torch.ones(1 << 20, device="cuda")
graph = torch.cuda.CUDAGraph()
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    static.add_(1)  # warm up off the default stream, as capture wants
torch.cuda.current_stream().wait_stream(side)
with torch.cuda.graph(graph):
    static.mul_(2)  # the graph holds static's address
parked = Storages("cuda").park()
graph.replay()
print(json.dumps({"moved": parked.moved, "fallback": parked.fallback,
                  "value": static[0].item()}))
""")
    assert found["moved"] == 0 and "CUDA graph" in found["fallback"]
    assert found["value"] == 4.0  # nothing moved under it


def test_memory_torch_does_not_own_leaves_everything_to_the_driver() -> None:
    found = _run("""
import json, numpy, torch
from fabric.worker.parking import Storages
mine = torch.ones(1000)
theirs = torch.from_numpy(numpy.zeros(10))  # the memory is numpy's: torch cannot resize it
parked = Storages("cpu").park()
print(json.dumps({"moved": parked.moved, "fallback": parked.fallback,
                  "kept": mine.untyped_storage().nbytes()}))
""")
    assert found["moved"] == 0 and found["kept"] == 4000
    assert "memory torch does not own" in found["fallback"]


def test_a_worker_without_torch_moves_nothing_and_never_imports_it() -> None:
    found = _run("""
import json, sys
from fabric.worker.parking import Storages
parked = Storages().park()
print(json.dumps({"moved": parked.moved, "fallback": parked.fallback,
                  "torch": "torch" in sys.modules}))
""")
    assert found == {"moved": 0, "fallback": None, "torch": False}

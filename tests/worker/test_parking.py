"""A worker's own parking of its torch storages (`fabric.worker.parking`), on CPU storages: the
walk, the release and the copy-back that move CUDA storages on a GPU host.

Each scenario runs in a fresh process, as a worker is one: the walk takes every tensor of the
process, and this one's (pytest's, other tests') are none of its business.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

TRAIN = """
import gc, json, sys, torch
from fabric.worker.parking import Storages

def run(park):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
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
               *(t for s in opt.state.values() for t in s.values()), rows, flat, x]
    ids = [id(t) for t in tensors] + [id(weight.untyped_storage())]
    found = {}
    if park:
        storages = Storages("cpu")
        parked = storages.park()
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
                        torch.rand(4))]
    return found

print(json.dumps({"parked": run(True), "never": run(False)}))
"""


def _run(script: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def trained() -> dict:
    return _run(TRAIN)


def test_a_park_moves_every_storage_to_host_memory_and_frees_it(trained: dict) -> None:
    parked = trained["parked"]
    assert parked["fallback"] is None and parked["released"]
    assert parked["moved"] == parked["held"] >= parked["bytes"] > 0
    assert parked["again"] == parked["moved"] and parked["back"] == 0


def test_tensors_views_and_optimizer_state_stay_the_same_objects(trained: dict) -> None:
    parked = trained["parked"]
    assert parked["same"] and parked["shared"] and parked["views"]


def test_training_goes_on_bit_identical_to_a_run_never_parked(trained: dict) -> None:
    assert trained["parked"]["result"] == trained["never"]["result"]


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

"""bench/gpu.py's probe of the CUDA checkpoint API, which decides what bench/device_check.sh runs
on a GPU machine: it must say why a driver refuses, answers wrongly or never answers, and not
wait on one that hangs. The driver is faked (tests/support/fake_cuda.py), and so is the CUDA
process it is asked about."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest
from fake_cuda import FakeDriver

from fabric.pool.cuda import ProcessState

GPU_PY = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("bench_gpu", GPU_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # a process that stands where the CUDA one would: ready, then waits
    stand_in = "import sys; print('ready', flush=True); sys.stdin.read()"
    monkeypatch.setattr(module, "HOLDER", stand_in)
    monkeypatch.setattr(module, "PROBE_WAIT", 0.5)
    return module


def test_a_driver_that_answers_running_passes(bench) -> None:
    assert bench.checkpoint_probe(FakeDriver()) is None


def test_a_driver_that_refuses_or_answers_wrongly_says_so(bench) -> None:
    refusing = FakeDriver()
    refusing.fail["state"] = ("cuCheckpointProcessGetState failed: CUDA_ERROR_NOT_SUPPORTED", None)
    assert "CUDA_ERROR_NOT_SUPPORTED" in bench.checkpoint_probe(refusing)
    wrong = FakeDriver()
    wrong.default = ProcessState.FAILED
    assert "FAILED for a running process" in bench.checkpoint_probe(wrong)


@pytest.mark.timeout(30)  # waiting on the driver would hang here
def test_a_driver_that_never_answers_is_not_waited_for(bench) -> None:
    released = threading.Event()

    class Hanging(FakeDriver):
        def state(self, pid: int) -> ProcessState:
            released.wait()
            return ProcessState.RUNNING

    try:
        assert "gave no answer within" in bench.checkpoint_probe(Hanging())
    finally:
        released.set()

"""On a real GPU: NVML discovery and leases, and the CUDA checkpoint driver on a live process.

`pytest -m gpu`; every test skips with its reason on a host without an NVIDIA GPU, or without
cuda-python / cuda-checkpoint for the checkpoint tests.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from fabric.pool import Leases, gpus
from fabric.pool.cuda import ProcessState, find_driver
from fabric.pool.parking import resume, suspend

pytestmark = pytest.mark.gpu

# A CUDA process holding 256 MiB of device memory with a known pattern; after each line on
# stdin it copies the memory back and prints whether the pattern is intact.
CHILD = r"""
import sys
from cuda.bindings import driver as d

def ok(result):
    assert result[0] == d.CUresult.CUDA_SUCCESS, result[0]
    return result[1:]

ok(d.cuInit(0))
(dev,) = ok(d.cuDeviceGet(0))
(ctx,) = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(ctx))
size = 256 << 20
pattern = bytes(range(256)) * (size // 256)
(ptr,) = ok(d.cuMemAlloc(size))
ok(d.cuMemcpyHtoD(ptr, pattern, size))
print("ready", flush=True)
for _ in sys.stdin:
    back = bytearray(size)
    ok(d.cuMemcpyDtoH(back, ptr, size))
    print("intact" if back == pattern else "corrupt", flush=True)
"""


@pytest.fixture(scope="module")
def devices() -> list[gpus.Gpu]:
    found = gpus.discover()
    if not found:
        pytest.skip("no NVIDIA GPU (NVML finds none)")
    return found


def test_nvml_devices_become_gpu_leases(devices: list[gpus.Gpu]) -> None:
    leases = Leases.for_host()
    assert (leases.kind, leases.slots) == ("gpu", len(devices))
    assert all(gpu.uuid.startswith("GPU-") and gpu.memory_total > 0 for gpu in devices)
    slot = leases.status()["leases"][0]
    assert slot["memory_total"] == devices[0].memory_total and "utilization" in slot


def test_a_live_cuda_process_is_checkpointed_off_the_gpu_and_back(devices) -> None:
    driver = find_driver()
    if driver is None:
        pytest.skip("neither cuda-python with driver >= 570 nor cuda-checkpoint is available")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        assert driver.state(child.pid) is ProcessState.RUNNING
        suspend(driver, child.pid)
        assert driver.state(child.pid) is ProcessState.CHECKPOINTED
        resume(driver, child.pid)
        assert driver.state(child.pid) is ProcessState.RUNNING
        child.stdin.write("check\n")
        child.stdin.flush()
        assert child.stdout.readline() == "intact\n"
    finally:
        child.kill()
        child.wait()

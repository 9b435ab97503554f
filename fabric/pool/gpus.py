"""The host's GPUs, as NVML (nvidia-ml-py) reports them: count, UUID, memory, utilization.

Only the server asks NVML; workers never do (a CUDA checkpoint cannot carry NVML handles).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TypedDict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total: int


def discover() -> list[Gpu]:
    """Every GPU NVML sees; none on a host without the NVIDIA driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("no GPUs: %s", exc)
        return []
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        gpus.append(Gpu(index, _text(pynvml.nvmlDeviceGetUUID(handle)),
                        _text(pynvml.nvmlDeviceGetName(handle)),
                        int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
    return gpus


class GpuUsage(TypedDict, total=False):
    """One GPU now: its memory and utilization, or why NVML could not read them."""

    memory_used: int
    memory_total: int
    utilization: int  # percent
    error: str


def usage(gpu: Gpu) -> GpuUsage:
    """Memory in use and utilization of one GPU now (for status)."""
    import pynvml

    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
    except pynvml.NVMLError as exc:
        return {"error": str(exc)}
    return {"memory_used": int(memory.used), "memory_total": int(memory.total),
            "utilization": int(rates.gpu)}


def driver_version() -> str | None:
    """The NVIDIA driver's version (`580.159.03`), or None without one."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return _text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError:
        return None


def mig_enabled(gpu: Gpu) -> bool:
    """Whether `gpu` is in MIG mode (split into instances); False for GPUs without MIG."""
    import pynvml

    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        return pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    except pynvml.NVMLError:
        return False


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value

"""The CUDA driver's process checkpoint API, behind a small interface.

A worker's CUDA state can be taken off the GPU by an outside process: lock the worker (its CUDA
calls block), checkpoint (device memory moves to host memory, the GPU is free), and later
restore (back onto a GPU) and unlock. The driver tracks each process's state:

    RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED --unlock--> RUNNING
                                                           any step may leave FAILED

A restore may move the process onto other GPUs of the same chip (`moves`: old UUID -> new UUID,
as NVML names them), so a parked worker resumes on whichever GPU its next lease is for.

Two implementations: cuda-python's `cuda.bindings.driver` (driver 570 or newer), and the
`cuda-checkpoint` binary when the bindings are absent. The server calls them, never a worker.
Tests use a fake with the same interface (tests/support/fake_cuda.py).
"""

from __future__ import annotations

import enum
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from ..errors import CudaError

MIN_DRIVER = 12080  # cuDriverGetVersion of driver 570, the first with cuCheckpointProcess*


class ProcessState(enum.Enum):
    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3


class Driver(Protocol):
    def holds(self, pid: int) -> bool: ...
    def state(self, pid: int) -> ProcessState: ...
    def lock(self, pid: int, timeout_ms: int) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int, moves: Mapping[str, str] | None = None) -> None: ...
    def unlock(self, pid: int) -> None: ...


def has_cuda_state(pid: int) -> bool:
    """Whether `pid` maps an NVIDIA device (it has created a CUDA context): only such a
    process has anything to checkpoint, and the driver refuses the others."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return any("/dev/nvidia" in line for line in maps)
    except OSError:
        return False


class BindingsDriver:
    """cuCheckpointProcess* through cuda-python."""

    holds = staticmethod(has_cuda_state)

    def __init__(self) -> None:
        # cuda-python, the gpu extra: installed on GPU hosts only, so not where pyright runs
        from cuda.bindings import driver  # pyright: ignore[reportMissingImports]

        self._d = driver
        self._check("cuInit", driver.cuInit(0))
        err, version = driver.cuDriverGetVersion()
        self._check("cuDriverGetVersion", (err,))
        if version < MIN_DRIVER:
            raise CudaError(f"the CUDA driver ({version}) predates the checkpoint API",
                            version=version)

    def _check(self, call: str, result: tuple) -> tuple:
        err = result[0]
        if err != self._d.CUresult.CUDA_SUCCESS:
            raise CudaError(f"{call} failed: {err.name}", error=err.name)
        return result[1:]

    def state(self, pid: int) -> ProcessState:
        (state,) = self._check("cuCheckpointProcessGetState",
                               self._d.cuCheckpointProcessGetState(pid))
        return ProcessState(int(state))

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = self._d.CUcheckpointLockArgs()
        args.timeoutMs = timeout_ms
        self._check("cuCheckpointProcessLock", self._d.cuCheckpointProcessLock(pid, args))

    def checkpoint(self, pid: int) -> None:
        self._check("cuCheckpointProcessCheckpoint",
                    self._d.cuCheckpointProcessCheckpoint(pid, None))

    def restore(self, pid: int, moves: Mapping[str, str] | None = None) -> None:
        args = self._restore_args(moves) if moves else None
        self._check("cuCheckpointProcessRestore", self._d.cuCheckpointProcessRestore(pid, args))

    def _restore_args(self, moves: Mapping[str, str]) -> Any:
        """CUcheckpointRestoreArgs whose GPU pairs move each old GPU onto its new one."""
        if not hasattr(self._d, "CUcheckpointGpuPair"):
            raise CudaError("this cuda-python cannot restore onto another GPU (gpuPairs came "
                            "with CUDA 12.9)", error="CUDA_ERROR_NOT_SUPPORTED")
        uuids = self._device_uuids()
        pairs = []
        for old, new in moves.items():
            pair = self._d.CUcheckpointGpuPair()
            try:
                pair.oldUuid, pair.newUuid = uuids[old.lower()], uuids[new.lower()]
            except KeyError as exc:
                raise CudaError(f"no GPU {exc.args[0]} here",
                                error="CUDA_ERROR_INVALID_DEVICE") from exc
            pairs.append(pair)
        args = self._d.CUcheckpointRestoreArgs()
        args.gpuPairs, args.gpuPairsCount = pairs, len(pairs)
        return args

    def _device_uuids(self) -> dict[str, Any]:
        """The driver's CUuuid of every GPU, by the name NVML gives it ("GPU-xxxxxxxx-...")."""
        (count,) = self._check("cuDeviceGetCount", self._d.cuDeviceGetCount())
        found = {}
        for ordinal in range(count):
            (device,) = self._check("cuDeviceGet", self._d.cuDeviceGet(ordinal))
            (raw,) = self._check("cuDeviceGetUuid", self._d.cuDeviceGetUuid(device))
            found[_nvml_key(raw.bytes)] = raw
        return found

    def unlock(self, pid: int) -> None:
        self._check("cuCheckpointProcessUnlock", self._d.cuCheckpointProcessUnlock(pid, None))


class BinaryDriver:
    """The same steps through the `cuda-checkpoint` utility."""

    holds = staticmethod(has_cuda_state)

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def _run(self, *args: str) -> str:
        result = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise CudaError(f"cuda-checkpoint {' '.join(args)} failed: {result.stderr.strip()}",
                            error=result.stderr.strip())
        return result.stdout

    def state(self, pid: int) -> ProcessState:
        return ProcessState[self._run("--get-state", "--pid", str(pid)).strip().upper()]

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._run("--action", "lock", "--pid", str(pid), "--timeout", str(timeout_ms))

    def checkpoint(self, pid: int) -> None:
        self._run("--action", "checkpoint", "--pid", str(pid))

    def restore(self, pid: int, moves: Mapping[str, str] | None = None) -> None:
        if moves:
            raise CudaError("the cuda-checkpoint utility cannot restore onto another GPU; "
                            "cuda-python can (pip install 'llfabric[gpu]')",
                            error="CUDA_ERROR_NOT_SUPPORTED")
        self._run("--action", "restore", "--pid", str(pid))

    def unlock(self, pid: int) -> None:
        self._run("--action", "unlock", "--pid", str(pid))


def _nvml_key(raw: bytes) -> str:
    """A GPU's 16-byte UUID as NVML and CUDA_VISIBLE_DEVICES write it, lowercased."""
    return f"gpu-{uuid.UUID(bytes=bytes(raw))}"


def find_driver() -> Driver | None:
    """The bindings with cuda-python and a recent driver, else the binary, else None."""
    try:
        return BindingsDriver()
    except (ImportError, CudaError):
        pass  # no bindings, or a driver without the API: the binary may still do it
    binary = shutil.which("cuda-checkpoint")
    return BinaryDriver(binary) if binary else None

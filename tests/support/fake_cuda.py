"""A fake CUDA checkpoint driver: the driver's per-process state machine, with failures on demand.

`fail[step] = (error, state)` makes the next call of `step` raise CudaError(error) and leave the
process in `state` (None: where it was), as the real driver does on a lock timeout (RUNNING)
or a broken checkpoint (FAILED). A restore that moves the process onto other GPUs is recorded
in `moves`; with `can_move` False it is refused, as by a driver without GPU pairs.
"""

from __future__ import annotations

from collections.abc import Mapping

from fabric.pool.cuda import CudaError, ProcessState

_MOVES = {  # step: (the state it needs, the state it leaves)
    "lock": (ProcessState.RUNNING, ProcessState.LOCKED),
    "checkpoint": (ProcessState.LOCKED, ProcessState.CHECKPOINTED),
    "restore": (ProcessState.CHECKPOINTED, ProcessState.LOCKED),
    "unlock": (ProcessState.LOCKED, ProcessState.RUNNING),
}


class FakeDriver:
    def __init__(self) -> None:
        self.states: dict[int, ProcessState] = {}
        self.fail: dict[str, tuple[str, ProcessState | None]] = {}
        self.calls: list[tuple[str, int]] = []
        self.without_cuda: set[int] = set()  # processes that never created a CUDA context
        self.default = ProcessState.RUNNING  # the state of a process first seen (a restored copy's)
        self.moves: list[tuple[int, dict[str, str]]] = []
        self.can_move = True

    def holds(self, pid: int) -> bool:
        return pid not in self.without_cuda

    def state(self, pid: int) -> ProcessState:
        self.calls.append(("state", pid))
        if "state" in self.fail:
            raise CudaError(self.fail.pop("state")[0], error="fake")
        return self.states.setdefault(pid, self.default)

    def _step(self, step: str, pid: int) -> None:
        self.calls.append((step, pid))
        needs, leaves = _MOVES[step]
        current = self.states.setdefault(pid, self.default)
        if step in self.fail:
            error, left = self.fail.pop(step)
            self.states[pid] = left or current
            raise CudaError(f"{step} failed: {error}", error=error)
        if current is not needs:
            raise CudaError(f"{step} needs {needs.name}, process is {current.name}",
                            error="CUDA_ERROR_ILLEGAL_STATE")
        self.states[pid] = leaves

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._step("lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._step("checkpoint", pid)

    def restore(self, pid: int, moves: Mapping[str, str] | None = None) -> None:
        if moves and not self.can_move:
            raise CudaError("restore onto another GPU is not supported",
                            error="CUDA_ERROR_NOT_SUPPORTED")
        self._step("restore", pid)
        if moves:
            self.moves.append((pid, dict(moves)))

    def unlock(self, pid: int) -> None:
        self._step("unlock", pid)

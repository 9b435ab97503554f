"""Parking at memory speed: the worker moves its own torch storages off the GPU and back.

The CUDA driver's checkpoint (`pool.parking`) moves a whole process's device memory to host
memory and back, at a fraction of a pinned copy's speed. Most of a notebook's device memory is
torch storages and the caching allocator's free blocks, which the worker moves itself at copy
speed: `Storages.park` copies each storage that Python reaches into pinned host memory, frees
its device memory in place (`resize_(0)`) and empties the caching allocator; `resume` allocates
each again and copies it back. A storage keeps its StorageImpl, so every tensor, view,
parameter, gradient and optimizer state on it stays the same object and sees the same bytes;
only its device address changes. What is left (the context, cuBLAS workspaces, tensors only C++
holds, such as an autograd graph's) stays where it is and goes through the driver's checkpoint,
which keeps addresses.

Something that holds device addresses outside torch's storages (a CUDA graph, a process group's
communicators, memory torch does not own, another CUDA library) would point at freed memory
after a move: then nothing moves, and the driver's checkpoint takes the whole process
(`Parked.fallback` says why).

The host copies are the process's own pages, pinned in place (cudaHostRegister): they count in
its resident memory, so the host's memory pressure sees them and a parked worker past it is
cooled to disk like any other. The walk, the release and the copy-back take a device type: on
"cpu" storages they run, and are tested, without a GPU. torch is never imported here: a worker
that has not imported it has nothing to move.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from typing import Any

from .messages import Parked

# CUDA libraries with allocations of their own, which may hold addresses of torch's memory
FOREIGN = ("cupy", "numba.cuda", "jax", "tensorflow")
HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable


class Storages:
    """The storages of one device type ("cuda", or "cpu" without a GPU) that this process
    parked, each with its host copy."""

    def __init__(self, device_type: str = "cuda") -> None:
        self.device_type = device_type
        self._held: list[tuple[Any, Any]] = []  # (storage, its bytes in host memory)

    @property
    def host_bytes(self) -> int:
        return sum(host.nbytes for _, host in self._held)

    def park(self) -> Parked:
        """Move every storage of the device type off it; nothing if something else may hold
        its addresses (the reason in `fallback`). Parking twice moves nothing more."""
        torch = sys.modules.get("torch")
        if torch is None or not self._in_use(torch) or self._held:
            return Parked(self.host_bytes)
        start = time.monotonic()
        objects = gc.get_objects()
        found, why = storages(torch, objects, self.device_type)
        why = why or self._holders(torch, objects)
        del objects
        if why is not None:
            return Parked(left=self._allocated(torch), fallback=why)
        self._synchronize(torch)  # the cell's kernels may still write them
        try:
            for storage in found:
                self._copy_out(torch, storage)
            self._synchronize(torch)
        except (RuntimeError, MemoryError) as exc:  # no host memory to pin: all stays
            with contextlib.suppress(RuntimeError):
                self._synchronize(torch)  # no copy may still write what is unpinned next
            self._drop(torch)
            return Parked(left=self._allocated(torch),
                         fallback=f"no host copy of its device memory: {exc}")
        for storage, _ in self._held:
            storage.resize_(0)  # its device memory goes back to the caching allocator
        if self.device_type == "cuda":
            torch.cuda.empty_cache()
        return Parked(self.host_bytes, self._allocated(torch), time.monotonic() - start)

    def resume(self) -> float:
        """Put every parked storage back on its device, as it was; the seconds it took.
        A failure (no device memory) leaves the process unusable: the caller retires it."""
        start = time.monotonic()
        if not self._held:
            return 0.0
        torch = sys.modules["torch"]
        for storage, host in self._held:
            storage.resize_(host.nbytes)
            _bytes_of(torch, storage).copy_(host, non_blocking=True)
        self._synchronize(torch)
        self._drop(torch)
        return time.monotonic() - start

    def _in_use(self, torch: Any) -> bool:
        return self.device_type != "cuda" or torch.cuda.is_initialized()

    def _holders(self, torch: Any, objects: list[Any]) -> str | None:
        """Why device addresses may be held outside torch's storages, or None."""
        if self.device_type != "cuda":
            return None
        loaded = [name for name in FOREIGN if name in sys.modules]
        if loaded:
            return f"{loaded[0]} is loaded: memory it holds is not torch's to move"
        distributed = sys.modules.get("torch.distributed")
        if distributed is not None and distributed.is_available() and \
                distributed.is_initialized():
            return "torch.distributed is initialized: its communicators hold device buffers"
        graph = torch.cuda.CUDAGraph
        if any(issubclass(type(obj), graph) for obj in objects):
            return "a CUDA graph holds the addresses of the memory it was captured on"
        return None

    def _copy_out(self, torch: Any, storage: Any) -> None:
        """Hold the storage with a copy of its bytes in host memory (pinned, for a device's),
        made asynchronously."""
        host = torch.empty(storage.nbytes(), dtype=torch.uint8)
        if self.device_type == "cuda":
            _pin(torch, host)
        self._held.append((storage, host))  # from here on `_drop` unpins it
        host.copy_(_bytes_of(torch, storage), non_blocking=True)

    def _drop(self, torch: Any) -> None:
        if self.device_type == "cuda":
            for _, host in self._held:
                _unpin(torch, host)
        self._held.clear()

    def _synchronize(self, torch: Any) -> None:
        if self.device_type == "cuda":
            for device in range(torch.cuda.device_count()):  # a cell may use several
                torch.cuda.synchronize(device)

    def _allocated(self, torch: Any) -> int:
        if self.device_type != "cuda":
            return 0
        return sum(torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count()))


def storages(torch: Any, objects: list[Any], device_type: str) -> tuple[list[Any], str | None]:
    """The distinct storages of `device_type` under the tensors among `objects` (and their
    gradients), or why they cannot all be moved: a tensor whose memory is no storage torch owns.
    """
    found: dict[int, Any] = {}
    tensors = [obj for obj in objects if issubclass(type(obj), torch.Tensor)]
    tensors += [t.grad for t in tensors if (t.is_leaf or t.retains_grad) and t.grad is not None]
    for tensor in tensors:
        if tensor.device.type != device_type:
            continue
        kind = type(tensor).__name__
        if tensor.layout is not torch.strided or tensor.is_nested or tensor.is_quantized:
            return [], f"a {kind} of layout {tensor.layout} keeps memory apart from storages"
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a wrapper subclass, without storage
            return [], f"a {kind} holds device memory that has no storage"
        if storage.nbytes() == 0 or storage._cdata in found:
            continue
        if not storage.resizable():
            return [], (f"a {kind} of {storage.nbytes()} bytes lies on memory torch does "
                        "not own (from_blob, DLPack)")
        found[storage._cdata] = storage
    return list(found.values()), None


def _bytes_of(torch: Any, storage: Any) -> Any:
    """A uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _pin(torch: Any, host: Any) -> None:
    """Page-lock `host`'s own pages, so copies to and from the device run by DMA. Registered,
    not allocated by torch's pinned cache: its exact size, in this process's resident memory."""
    if host.nbytes:
        # portable: pinned for every GPU's context, as a cell on several GPUs needs
        error = int(torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.nbytes,
                                                         HOST_REGISTER_PORTABLE))
        if error:
            raise RuntimeError(f"cudaHostRegister failed (cudaError {error})")


def _unpin(torch: Any, host: Any) -> None:
    if host.nbytes:
        torch.cuda.cudart().cudaHostUnregister(host.data_ptr())

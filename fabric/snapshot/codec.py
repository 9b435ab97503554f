"""Objects <-> bytes for one group of variables.

cloudpickle carries what the notebook defined (functions, classes, lambdas) by value. One thing it
gets wrong for notebooks: a function pickled by value drags the globals it reads into its own
pickle and comes back bound to a private globals dict. A notebook function must instead come back
bound to the live namespace of the worker that loads it, reading whatever the session holds now.
So functions whose globals are the session namespace are reduced to their code and rebuilt against
the namespace being loaded into.

Memory shared by several arrays or tensors must stay shared: a view written in a later cell has
to change its base. Each block of CPU memory is pickled once, and every numpy array and CPU
tensor on it is rebuilt on that one copy.

Array memory never enters the pickle stream: protocol 5 hands each block out of band as a buffer,
which the store hashes and writes straight from the object's own memory (no copy), and which a
load reads from disk into the one writable buffer the arrays are then rebuilt on. CUDA tensors are
staged through pinned host memory (a save's in one copy, a load's piece by piece: `staging`) and
go back to the same device index.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import sys
import types
from collections.abc import Callable, Sequence
from typing import IO, Any, NamedTuple, cast

import cloudpickle  # pyright: ignore[reportMissingTypeStubs]

from .staging import from_numpy

# cloudpickle ships no types; its Pickler is pickle's, overriding `reducer_override`
_CloudPickler = cast(type[pickle.Pickler], cloudpickle.Pickler)
# the type of lru_cache's wrappers, which functools names only privately
_LRU_CACHE_WRAPPER = type(functools.lru_cache(maxsize=None)(lambda: None))
_Reduced = tuple[Callable[..., Any], tuple[Any, ...]]  # a `__reduce__`'s: rebuild, arguments

_loading_into: dict[str, Any] | None = None  # the namespace functions are rebound to during loads()


def _make_function(code: types.CodeType, name: str, ncells: int) -> types.FunctionType:
    if _loading_into is None:
        raise pickle.UnpicklingError("a notebook function can only be loaded into a namespace")
    closure = tuple(types.CellType() for _ in range(ncells)) or None
    return types.FunctionType(code, _loading_into, name, None, closure)


def _set_function_state(fn: types.FunctionType, state: dict[str, Any]) -> types.FunctionType:
    for cell, value in zip(fn.__closure__ or (), state.pop("cells"), strict=True):
        if value is not _EMPTY:
            cell.cell_contents = value
    fn.__dict__.update(state.pop("dict"))
    for attr, value in state.items():
        setattr(fn, attr, value)
    return fn


class _Empty:
    """Marks a closure cell that had no value yet (a name assigned later in the outer scope)."""

    def __reduce__(self) -> str:
        return "_EMPTY"


_EMPTY = _Empty()


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


class _Memory:
    """A block of CPU memory under arrays and tensors of one pickle, pickled once as bytes.

    Every numpy array and torch tensor on the same block (views, `torch.from_numpy`) is rebuilt
    on the one loaded copy, so a write through one shows through all, as before the save.
    """

    def __init__(self, data: Any) -> None:
        self.data = data  # a uint8 numpy array over the block

    def __reduce__(self) -> _Reduced:
        # out of band: the stream holds only the buffer's place, the store holds its bytes
        return _loaded_memory, (pickle.PickleBuffer(self.data),)


def _loaded_memory(data: Any) -> Any:
    import numpy as np

    return np.frombuffer(data, dtype=np.uint8)


class _DeviceMemory:
    """A CUDA storage, staged once through pinned host memory however many tensors view it."""

    def __init__(self, host: _Memory, device: int) -> None:
        self.host, self.device = host, device

    def __reduce__(self) -> _Reduced:
        return _device_storage, (self.host, self.device)


def _device_storage(host: Any, device: int) -> Any:
    from .staging import to_device

    return to_device(host, device)


def _ndarray_on(memory: Any, dtype: Any, shape: tuple[int, ...], strides: tuple[int, ...],
                offset: int,
                writeable: bool) -> Any:
    import numpy as np

    array = np.ndarray(shape, dtype, buffer=memory, offset=offset, strides=strides)
    array.flags.writeable = writeable
    return array


def _array_root(arr: Any) -> Any:
    """The array at the end of `arr`'s chain of bases: the one whose memory it views."""
    root = arr
    while isinstance(root.base, type(arr)):
        root = root.base
    return root


def _host_bytes(tensor: Any, storage: Any) -> Any:
    """The bytes of `tensor`'s storage as a uint8 numpy array; CUDA memory is copied to host."""
    import torch

    flat = tensor.new_empty(0, dtype=torch.uint8).set_(storage)
    if flat.device.type == "cuda":
        # pinned memory: the device-to-host copy runs by DMA at full bus speed
        host = torch.empty(flat.shape, dtype=torch.uint8, pin_memory=True)
        host.copy_(flat)
        flat = host
    return flat.numpy()


def _rebuild_tensor(memory: Any, dtype: Any, offset: int, size: tuple[int, ...],
                    stride: tuple[int, ...], requires_grad: bool, grad: Any) -> Any:
    import torch

    # a CUDA tensor's memory arrives as its device storage, a CPU tensor's as a uint8 array
    storage = memory if isinstance(memory, torch.UntypedStorage) else \
        from_numpy(memory).untyped_storage()
    tensor = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)
    if requires_grad:
        tensor.requires_grad_(True)
    if grad is not None:
        tensor.grad = grad
    return tensor


def _closed_file(name: Any, mode: str, encoding: str | None) -> IO[Any]:
    """A closed file that reads as the one that was saved (`with open(...) as f` leaves one)."""
    mode = mode.replace("x", "w")
    file = open(os.devnull, mode, encoding=encoding if "b" not in mode else None)  # noqa: SIM115
    raw: Any = getattr(file, "buffer", file)  # a text file's layers: buffer, then raw
    named: Any = getattr(raw, "raw", raw)
    named.name = name
    file.close()
    return file


def _reduce_file(file: Any) -> Any:
    if not file.closed:  # live state: not cloudpickle's copy of a text file into a StringIO,
        # which would come back as another kind of object, its writes going nowhere
        raise pickle.PicklingError(f"an open file ({getattr(file, 'name', '?')!r}) is live "
                                   "state of its process and cannot be saved")
    return _closed_file, (getattr(file, "name", None), getattr(file, "mode", "r"),
                          getattr(file, "encoding", None))


def _reduce_parameter(param: Any) -> _Reduced:
    return _rebuild_parameter, (param.data, param.requires_grad, param.grad)


def _rebuild_parameter(data: Any, requires_grad: bool, grad: Any) -> Any:
    import torch

    param = torch.nn.Parameter(data, requires_grad=requires_grad)
    if grad is not None:
        param.grad = grad
    return param


def _reduce_lru_cache(wrapper: Any) -> _Reduced:
    """The wrapped function and the cache's parameters; the cache itself is not kept."""
    params = wrapper.cache_parameters()
    return _rebuild_lru_cache, (wrapper.__wrapped__, params["maxsize"], params["typed"])


def _rebuild_lru_cache(wrapped: Any, maxsize: int | None, typed: bool) -> Any:
    return functools.lru_cache(maxsize=maxsize, typed=typed)(wrapped)


_FILE_TYPES = (io.TextIOWrapper, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.FileIO)


class _Pickler(_CloudPickler):
    def __init__(self, file: io.BytesIO, namespace: dict[str, Any]) -> None:
        self.buffers: list[pickle.PickleBuffer] = []
        super().__init__(file, protocol=5, buffer_callback=self.buffers.append)
        self._namespace = namespace
        self._memory: dict[tuple[int, int], _Memory] = {}
        self._device: dict[int, _DeviceMemory] = {}
        np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
        self._ndarray = np.ndarray if np is not None else None
        self._tensor = torch.Tensor if torch is not None else None
        self._parameter = torch.nn.Parameter if torch is not None else None

    def _memory_for(self, address: int, nbytes: int, as_bytes: Callable[[], Any]) -> _Memory:
        key = (address, nbytes)
        if key not in self._memory:
            self._memory[key] = _Memory(as_bytes())
        return self._memory[key]

    def _reduce_ndarray(self, arr: Any) -> Any:
        root = _array_root(arr)
        if not root.flags.c_contiguous or arr.dtype.hasobject:
            return NotImplemented  # pickled by numpy, with its own copy of the data
        start = root.__array_interface__["data"][0]
        memory = self._memory_for(start, root.nbytes, lambda: root.reshape(-1).view("u1"))
        offset = arr.__array_interface__["data"][0] - start
        return _ndarray_on, (memory, arr.dtype, arr.shape, arr.strides, offset,
                             arr.flags.writeable)

    def _reduce_tensor(self, tensor: Any) -> Any:
        if tensor.grad_fn is not None:
            # Saved as a leaf it would print differently and, worse, a later backward() would
            # silently compute nothing: the graph lives only in this process.
            raise pickle.PicklingError(f"a tensor in an autograd graph "
                                       f"(grad_fn={type(tensor.grad_fn).__name__}) cannot be "
                                       "saved apart from the process that built it")
        if (tensor.layout is not self._torch_strided or tensor.device.type not in ("cpu", "cuda")
                or tensor.is_quantized or tensor.is_nested):
            return NotImplemented
        storage = tensor.untyped_storage()
        memory: Any = self._memory_for(storage.data_ptr(), storage.nbytes(),
                                       lambda: _host_bytes(tensor, storage))
        if tensor.device.type == "cuda":
            memory = self._device.setdefault(id(memory), _DeviceMemory(memory, tensor.device.index))
        grad = tensor.grad if tensor.is_leaf or tensor.retains_grad else None
        return _rebuild_tensor, (memory, tensor.dtype, tensor.storage_offset(),
                                 tuple(tensor.size()), tensor.stride(), tensor.requires_grad, grad)

    @property
    def holds_device(self) -> bool:
        """Whether what it pickled holds CUDA memory."""
        return bool(self._device)

    @property
    def _torch_strided(self) -> Any:
        return sys.modules["torch"].strided

    def reducer_override(self, obj: object) -> Any:
        kind = type(obj)
        if kind is self._ndarray:
            return self._reduce_ndarray(obj)
        if kind is self._tensor:
            return self._reduce_tensor(obj)
        if kind is self._parameter:  # torch's own reduction drops .grad
            return _reduce_parameter(obj)
        if kind in _FILE_TYPES:
            return _reduce_file(obj)
        if kind is _LRU_CACHE_WRAPPER and getattr(obj, "__module__", "") == "__main__":
            # pickled by reference otherwise, to a name the loading worker may not have yet
            return _reduce_lru_cache(obj)
        if isinstance(obj, types.FunctionType) and obj.__globals__ is self._namespace:
            state: dict[str, Any] = {
                "cells": [_cell_value(c) for c in obj.__closure__ or ()],
                "dict": obj.__dict__,
                "__defaults__": obj.__defaults__,
                "__kwdefaults__": obj.__kwdefaults__,
                "__qualname__": obj.__qualname__,
                "__module__": obj.__module__,
                "__doc__": obj.__doc__,
                "__annotations__": obj.__annotations__,
            }
            ncells = len(obj.__closure__ or ())
            return (_make_function, (obj.__code__, obj.__name__, ncells), state, None, None,
                    _set_function_state)
        return super().reducer_override(obj)


class Encoded(NamedTuple):
    """A pickled group: the stream, and the memory blocks it refers to out of band, in order."""

    stream: bytes
    buffers: list[memoryview]
    device: bool = False  # it holds CUDA memory: unpickled, it makes a CUDA context

    @property
    def nbytes(self) -> int:
        return len(self.stream) + sum(b.nbytes for b in self.buffers)


def dumps(values: dict[str, Any], namespace: dict[str, Any]) -> Encoded:
    """Pickle a group's variables; functions of `namespace` are kept bound to it by name.

    The buffers are views of the live objects' memory, valid until the objects change.
    """
    buf = io.BytesIO()
    pickler = _Pickler(buf, namespace)
    pickler.dump(values)
    return Encoded(buf.getvalue(), [b.raw() for b in pickler.buffers], pickler.holds_device)


def loads(data: Encoded | bytes, namespace: dict[str, Any],
          buffers: Sequence[Any] = ()) -> dict[str, Any]:
    """Unpickle a group; notebook functions come back bound to `namespace`."""
    global _loading_into
    if isinstance(data, Encoded):
        data, buffers = data.stream, data.buffers
    previous, _loading_into = _loading_into, namespace
    try:
        values = pickle.loads(data, buffers=buffers)
    finally:
        _loading_into = previous
    if not isinstance(values, dict):
        raise pickle.UnpicklingError("a group blob must hold a dict of variables")
    return cast(dict[str, Any], values)  # names to values, as `dumps` wrote it

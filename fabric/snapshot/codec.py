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
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

_loading_into: dict | None = None  # the namespace functions are rebound to during loads()


def _make_function(code: types.CodeType, name: str, ncells: int) -> types.FunctionType:
    if _loading_into is None:
        raise pickle.UnpicklingError("a notebook function can only be loaded into a namespace")
    closure = tuple(types.CellType() for _ in range(ncells)) or None
    return types.FunctionType(code, _loading_into, name, None, closure)


def _set_function_state(fn: types.FunctionType, state: dict) -> types.FunctionType:
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

    def __reduce__(self) -> tuple:
        # a writable PickleBuffer comes back as a bytearray: writable memory, one copy
        return _loaded_memory, (pickle.PickleBuffer(self.data),)


def _loaded_memory(data: bytearray) -> Any:
    import numpy as np

    return np.frombuffer(data, dtype=np.uint8)


def _ndarray_on(memory: Any, dtype: Any, shape: tuple, strides: tuple, offset: int,
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


def _rebuild_tensor(memory: Any, dtype: Any, offset: int, size: tuple, stride: tuple,
                    requires_grad: bool, grad: Any) -> Any:
    import torch

    storage = torch.from_numpy(memory).untyped_storage()
    tensor = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    if requires_grad:
        tensor.requires_grad_(True)
    if grad is not None:
        tensor.grad = grad
    return tensor


def _closed_file(name: Any, mode: str, encoding: str | None) -> io.IOBase:
    """A closed file that reads as the one that was saved (`with open(...) as f` leaves one)."""
    mode = mode.replace("x", "w")
    file = open(os.devnull, mode, encoding=encoding if "b" not in mode else None)  # noqa: SIM115
    raw = getattr(file, "buffer", file)
    getattr(raw, "raw", raw).name = name
    file.close()
    return file


def _reduce_file(file: Any) -> Any:
    if not file.closed:
        return NotImplemented  # an open file is live state: it cannot be saved
    return _closed_file, (getattr(file, "name", None), getattr(file, "mode", "r"),
                          getattr(file, "encoding", None))


def _rebuild_parameter(data: Any, requires_grad: bool, grad: Any) -> Any:
    import torch

    param = torch.nn.Parameter(data, requires_grad=requires_grad)
    if grad is not None:
        param.grad = grad
    return param


def _rebuild_lru_cache(wrapped: Any, maxsize: int | None, typed: bool) -> Any:
    return functools.lru_cache(maxsize=maxsize, typed=typed)(wrapped)


_FILE_TYPES = (io.TextIOWrapper, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.FileIO)


class _Pickler(cloudpickle.Pickler):
    def __init__(self, file: io.BytesIO, namespace: dict) -> None:
        super().__init__(file, protocol=5)
        self._namespace = namespace
        self._memory: dict[tuple[int, int], _Memory] = {}
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
        if (tensor.layout is not self._torch_strided or tensor.device.type != "cpu"
                or tensor.is_quantized or tensor.is_nested):
            return NotImplemented
        storage = tensor.untyped_storage()
        uint8 = sys.modules["torch"].uint8
        memory = self._memory_for(storage.data_ptr(), storage.nbytes(),
                                  lambda: tensor.new_empty(0, dtype=uint8).set_(storage).numpy())
        grad = tensor.grad if tensor.is_leaf or tensor.retains_grad else None
        return _rebuild_tensor, (memory, tensor.dtype, tensor.storage_offset(),
                                 tuple(tensor.size()), tensor.stride(), tensor.requires_grad, grad)

    @property
    def _torch_strided(self) -> Any:
        return sys.modules["torch"].strided

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is self._ndarray:
            return self._reduce_ndarray(obj)
        if kind is self._tensor:
            return self._reduce_tensor(obj)
        if kind is self._parameter:  # torch's own reduction drops .grad
            return _rebuild_parameter, (obj.data, obj.requires_grad, obj.grad)
        if kind in _FILE_TYPES:
            return _reduce_file(obj)
        if kind is functools._lru_cache_wrapper and getattr(obj, "__module__", "") == "__main__":
            # pickled by reference otherwise, to a name the loading worker may not have yet;
            # the cache itself is not kept
            params = obj.cache_parameters()
            return _rebuild_lru_cache, (obj.__wrapped__, params["maxsize"], params["typed"])
        if isinstance(obj, types.FunctionType) and obj.__globals__ is self._namespace:
            state = {
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


def dumps(values: dict[str, Any], namespace: dict) -> bytes:
    """Pickle a group's variables; functions of `namespace` are kept bound to it by name."""
    buf = io.BytesIO()
    _Pickler(buf, namespace).dump(values)
    return buf.getvalue()


def loads(data: bytes, namespace: dict) -> dict[str, Any]:
    """Unpickle a group; notebook functions come back bound to `namespace`."""
    global _loading_into
    previous, _loading_into = _loading_into, namespace
    try:
        values = pickle.loads(data)
    finally:
        _loading_into = previous
    if not isinstance(values, dict):
        raise pickle.UnpicklingError("a group blob must hold a dict of variables")
    return values

"""Objects <-> bytes for one group of variables.

cloudpickle carries what the notebook defined (functions, classes, lambdas) by value. One thing it
gets wrong for notebooks: a function pickled by value drags the globals it reads into its own
pickle and comes back bound to a private globals dict. A notebook function must instead come back
bound to the live namespace of the worker that loads it, reading whatever the session holds now.
So functions whose globals are the session namespace are reduced to their code and rebuilt against
the namespace being loaded into.

Memory shared by several arrays or tensors must stay shared: a view written in a later cell has
to change its base. numpy views are rebuilt on their (once pickled) base array; CPU tensors are
rebuilt on one storage per pickle, whatever number of tensors view it.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import sys
import types
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


def _ndarray_view(root: Any, dtype: Any, shape: tuple, strides: tuple, offset: int,
                  writeable: bool) -> Any:
    import numpy as np

    view = np.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)
    view.flags.writeable = writeable and root.flags.writeable
    return view


def _reduce_ndarray(arr: Any) -> Any:
    """A view of a C-contiguous array, as (the array it views, geometry).

    The root may itself sit on a non-array buffer (bytes, after an earlier load): it is pickled
    as an array, with its data, all the same.
    """
    root = arr
    while isinstance(root.base, type(arr)):
        root = root.base
    if root is arr or not root.flags.c_contiguous or arr.dtype.hasobject:
        return NotImplemented
    offset = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return _ndarray_view, (root, arr.dtype, arr.shape, arr.strides, offset, arr.flags.writeable)


class _Storage:
    """One tensor storage in a pickle; the pickler's memo makes every tensor on it share it."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def __reduce__(self) -> tuple:
        import torch

        data = torch.empty(0, dtype=torch.uint8).set_(self.storage).numpy()
        return _storage_from_bytes, (data,)


def _storage_from_bytes(data: Any) -> Any:
    import torch

    return torch.from_numpy(data).untyped_storage()


def _rebuild_tensor(storage: Any, dtype: Any, offset: int, size: tuple, stride: tuple,
                    requires_grad: bool, grad: Any) -> Any:
    import torch

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
        self._storages: dict[int, _Storage] = {}
        np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
        self._ndarray = np.ndarray if np is not None else None
        self._tensor = torch.Tensor if torch is not None else None
        self._parameter = torch.nn.Parameter if torch is not None else None

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
        key = storage.data_ptr()
        holder = self._storages.setdefault(key, _Storage(storage)) if key else _Storage(storage)
        grad = tensor.grad if tensor.is_leaf or tensor.retains_grad else None
        return _rebuild_tensor, (holder, tensor.dtype, tensor.storage_offset(),
                                 tuple(tensor.size()), tensor.stride(), tensor.requires_grad, grad)

    @property
    def _torch_strided(self) -> Any:
        return sys.modules["torch"].strided

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is self._ndarray:
            return _reduce_ndarray(obj)
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

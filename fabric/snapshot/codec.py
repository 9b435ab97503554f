"""Objects <-> bytes for one group of variables.

cloudpickle carries what the notebook defined (functions, classes, lambdas) by value. One thing it
gets wrong for notebooks: a function pickled by value drags the globals it reads into its own
pickle and comes back bound to a private globals dict. A notebook function must instead come back
bound to the live namespace of the worker that loads it, reading whatever the session holds now.
So functions whose globals are the session namespace are reduced to their code and rebuilt against
the namespace being loaded into.
"""

from __future__ import annotations

import io
import pickle
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


class _Pickler(cloudpickle.Pickler):
    def __init__(self, file: io.BytesIO, namespace: dict) -> None:
        super().__init__(file, protocol=5)
        self._namespace = namespace

    def reducer_override(self, obj: Any) -> Any:
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

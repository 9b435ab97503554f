"""Reading a decoded msgpack map into a dataclass, every field checked against its type hint.

Every wire (client <-> server `messages`, server <-> worker `worker.messages`, server <-> zygote
`worker.control`, and the `status` replies) reads what it receives through `record`, so a value
of the wrong type is refused the same way everywhere. The hints it understands are the wire's
shapes: str, int (never a bool), float (an int is accepted), bool, None, Any, `X | Y`,
`list[X]`, `tuple[X, ...]` and `tuple[X, Y]` (a list is accepted), `dict[K, V]`, and nested
dataclasses (read with their own `from_wire` if they have one, else field by field). Each wire
words the `Mismatch` as its own error.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any


class Mismatch(Exception):
    """A value that is not of the type its field declares, or a field that is missing."""

    def __init__(self, where: str, expected: str, value: object = None,
                 missing: bool = False) -> None:
        self.where, self.expected, self.value, self.missing = where, expected, value, missing
        what = "is missing" if missing else f"is {_shown(value)}, not {expected}"
        super().__init__(f"{where} {what}")


def _shown(value: object) -> str:
    return repr(value) if len(repr(value)) <= 60 else f"a {type(value).__name__}"


def name(hint: Any) -> str:
    """A type hint as an error message says it."""
    if typing.get_origin(hint) is not None or not hasattr(hint, "__name__"):
        return str(hint).replace("typing.", "")
    return hint.__name__


@functools.cache
def fields(cls: type) -> dict[str, tuple[Any, bool]]:
    """A dataclass's fields: name -> (type hint, whether the field is required)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls)}


def record(cls: type, wire: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """The values of dataclass `cls`'s fields in `wire`, checked (keys it does not declare are
    left for the caller to refuse or ignore); Mismatch names the first field that is wrong."""
    values: dict[str, Any] = {}
    for field, (hint, required) in fields(cls).items():
        at = f"{where}.{field}" if where else field
        if field in wire:
            values[field] = check(wire[field], hint, at)
        elif required:
            raise Mismatch(at, name(hint), missing=True)
    return values


def check(value: Any, hint: Any, where: str) -> Any:
    """`value` as `hint` declares it (an int as a float, a list as a tuple, a map as a nested
    dataclass), or Mismatch."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (types.UnionType, typing.Union):
        options = [a for a in args if a is not type(None)]
        if value is None and len(options) < len(args):
            return None
        if len(options) == 1:  # an optional's own mismatch names the field inside, if any
            return check(value, options[0], where)
        for option in options:
            try:
                return check(value, option, where)
            except Mismatch:
                continue
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if (reader := getattr(hint, "from_wire", None)) is not None:
            return reader(value)  # it words its own refusal
        if isinstance(value, dict):
            return hint(**record(hint, value, where))
    elif hint is type(None):
        if value is None:
            return None
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif origin is list:
        if isinstance(value, list | tuple):
            return [check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin is tuple:
        if isinstance(value, list | tuple):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
            if len(value) == len(args):
                return tuple(check(v, a, f"{where}[{i}]")
                             for i, (v, a) in enumerate(zip(value, args, strict=True)))
    elif origin is dict:
        if isinstance(value, dict):
            return {check(k, args[0], f"{where} key"): check(v, args[1], f"{where}[{k!r}]")
                    for k, v in value.items()}
    elif isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise Mismatch(where, name(hint), value)

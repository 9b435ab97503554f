"""Plain data found unchanged at C speed: neither walked nor pickled again.

A save learns whether a group changed by pickling it, and before that walks its objects to find
which variables share them: for a list of 100k dicts, nearly all of a save's time, though the
cell only read it. The kernel's write tracking (`written`) cannot tell here: reading an object
writes its reference count. A value made only of builtin containers and atoms (dict, list,
tuple, set, frozenset, str, int, float, complex, bool, None) has a proof of its own: marshal
writes it whole, in one pass at C speed, and what it writes fixes what its pickle holds:

- each object's exact type: marshal refuses subclasses and other types but for one case, an
  object with a buffer (bytearray, an array, a memoryview), which it writes as bytes. So no
  value holding bytes is fingerprinted, and equal output hides no such object;
- each value, in order (a dict's in its order, as pickle writes it);
- which objects are referenced more than once: version 4 marks each object whose reference
  count is above one, and writes its later occurrences as references to the first.

A value is fingerprinted only while every container below it is referenced once, by its parent.
Then no other variable reaches into it; equal output later (whose marks say each container is
still referenced once) proves that none has begun to since, and that the value pickles as it did.
The value itself may be bound to other names too: the grouping walk links whoever reaches it.

Checking a value costs one marshal of it, and none where its type or the number of items it
holds itself changed: it has changed. Marshal copies an array the value gained otherwise (one
that replaced an item, or nested deeper) whole, once: the value is then found changed, and
fingerprinted again only once a save finds it unchanged and plain.
"""

from __future__ import annotations

import gc
import marshal
import sys
from collections.abc import Sized
from itertools import compress
from typing import Any, NamedTuple, cast

from .store import blob_id

_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})
_PLAIN = _CONTAINERS | {str, int, float, complex, bool, type(None)}
# reference counts mean what this relies on only in CPython
SUPPORTED = sys.implementation.name == "cpython"


class PlainPrint(NamedTuple):
    length: int  # the items the value holds itself (0: an atom)
    digest: str  # of its marshal output


def fingerprint(value: object) -> PlainPrint | None:
    """`value`'s fingerprint if it is plain data no other object reaches into, else None."""
    if not SUPPORTED or type(value) not in _PLAIN or not _unshared_below(value):
        return None
    digest = _digest(value)
    return None if digest is None else PlainPrint(_length(value), digest)


def unchanged(value: object, known: PlainPrint) -> bool:
    """Whether `value` is as it was when it was fingerprinted `known` (see the module's note)."""
    return type(value) in _PLAIN and _length(value) == known.length and \
        _digest(value) == known.digest


def _length(value: object) -> int:
    return len(value) if isinstance(value, Sized) else 0


def _digest(value: object) -> str | None:
    try:
        return blob_id(marshal.dumps(cast(Any, value), 4))
    except ValueError:  # an object marshal cannot write, or nested too deep
        return None


def _held(parents: list[object]) -> tuple[set[type], list[object], list[int]]:
    """The types of the objects `parents` hold, the containers among them, and the reference
    count of each container (counting this function's own references too: one list's)."""
    inner = gc.get_referents(*parents)
    kinds = set(map(type, inner))
    if kinds.isdisjoint(_CONTAINERS):
        return kinds, [], []
    if not kinds <= _CONTAINERS:
        inner = list(compress(inner, map(_CONTAINERS.__contains__, map(type, inner))))
    return kinds, inner, list(map(sys.getrefcount, inner))


_ONCE = _held([[[]]])[2][0]  # the count `_held` gives a container its parent alone holds


def _unshared_below(value: object) -> bool:
    """Whether every object below `value` is plain, each container referenced by its parent
    alone: one level at a time, at C speed."""
    parents = [value]
    while parents:
        kinds, parents, counts = _held(parents)
        if not kinds <= _PLAIN or counts.count(_ONCE) != len(counts):
            return False
    return True

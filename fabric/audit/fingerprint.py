"""Value fingerprints: a digest of each variable's value that two processes agree on when the
values are equal, wherever the objects live. The audit compares a cell's run on its closure
alone with its run on the whole session by them.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import xxhash

from ..snapshot import codec


def fingerprints(namespace: dict, names: list[str]) -> dict[str, str]:
    """A digest of each variable's value (module aliases and absent names skipped)."""
    return {name: Fingerprint().of(namespace[name]) for name in names
            if name in namespace and not isinstance(namespace[name], types.ModuleType)}


class Fingerprint:
    """A digest of an object's value that two processes agree on for equal values.

    Pickled bytes will not do: pickle's memo follows object identity, and a set of objects
    iterates in the order of their addresses. So the walk digests sets by their sorted element
    digests, arrays and tensors by their bytes, objects by their type and attributes, and code
    by its bytecode, the names it uses and its constants; a reference back into the path being
    walked digests as a cycle marker. The walk keeps its own stack: object graphs (an autograd
    tape) nest deeper than Python's.
    """

    budget = 2_000_000  # objects; past it the value is summarised by its type alone

    def __init__(self) -> None:
        # id -> (object, digest): holding the object keeps its id from being reused by a
        # temporary made later in the walk (a __getstate__ copy)
        self.memo: dict[int, tuple[Any, str]] = {}
        self.path: set[int] = set()
        self.left = self.budget

    def of(self, root: Any) -> str:
        result: list[str] = []
        # frames: [object, prefix parts, children, how to combine, child digests]
        stack: list[list] = []
        self._visit(root, stack, result)
        while stack:
            frame = stack[-1]
            obj, prefix, children, combine, digests = frame
            if len(digests) < len(children):
                self._visit(children[len(digests)], stack, digests)
                continue
            stack.pop()
            self.path.discard(id(obj))
            if combine == "pairs":
                digests = [f"{k}={v}" for k, v in zip(digests[::2], digests[1::2], strict=True)]
            elif combine == "sorted":
                digests = sorted(digests)
            kind = type(obj)
            digest = _hash(f"{kind.__module__}.{kind.__qualname__}", [*prefix, *digests])
            self.memo[id(obj)] = (obj, digest)
            (stack[-1][4] if stack else result).append(digest)
        return result[0] if self.left >= 0 else f"too large: {type(root).__qualname__}"

    def _visit(self, obj: Any, stack: list[list], out: list[str]) -> None:
        """Append `obj`'s digest to `out` if it is known now, else push a frame for it."""
        kind = type(obj)
        key = id(obj)
        if kind in _ATOM_TYPES:
            out.append(f"{kind.__name__}:{obj!r}")
        elif key in self.memo:
            out.append(self.memo[key][1])
        elif key in self.path:
            out.append(f"cycle:{kind.__qualname__}")
        else:
            self.left -= 1
            if self.left < 0:
                out.append("?")
                return
            self.path.add(key)
            stack.append([obj, *_expand(obj), []])


def _expand(obj: Any) -> tuple[list[str], list, str]:
    """What an object's digest is made of: fixed parts, children, and how children combine."""
    if isinstance(obj, (list, tuple)):
        return [], list(obj), "ordered"
    if isinstance(obj, dict):
        return [], [x for item in obj.items() for x in item], "pairs"
    if isinstance(obj, (set, frozenset)):
        return [], list(obj), "sorted"
    if isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType)):
        name = getattr(obj, "__qualname__", None) or obj.__name__
        return [getattr(obj, "__module__", "") or "", name], [], "ordered"
    if isinstance(obj, types.FunctionType):
        cells = [c.cell_contents for c in obj.__closure__ or () if _has_contents(c)]
        children = [obj.__code__, obj.__defaults__, obj.__kwdefaults__, *cells]
        return [obj.__qualname__], children, "ordered"
    if isinstance(obj, types.CodeType):  # not its file: a cell's file is named after its process
        return ([obj.co_qualname, xxhash.xxh3_64_hexdigest(obj.co_code),
                 repr((obj.co_names, obj.co_varnames))], list(obj.co_consts), "ordered")
    if (memory := _memory_of(obj)) is not None:
        return memory, [], "ordered"
    kind = type(obj)
    if kind.__reduce_ex__ is not object.__reduce_ex__ or kind.__reduce__ is not object.__reduce__:
        try:  # how the object pickles itself: its value, without its caches
            made, *rest = obj.__reduce_ex__(4)
            parts = [list(x) if isinstance(x, Iterator) else x for x in rest]
            return [getattr(made, "__qualname__", repr(made))], parts, "ordered"
        except Exception:
            pass
    getstate = getattr(kind, "__getstate__", None)
    if getstate is not None and getstate is not object.__getstate__:
        try:  # what the object itself calls its state (caches left out)
            return [], [obj.__getstate__()], "ordered"
        except Exception:
            pass
    state = getattr(obj, "__dict__", None)
    slots = [getattr(obj, n, None) for c in type(obj).__mro__
             for n in getattr(c, "__slots__", ()) if isinstance(n, str)]
    if state is not None or slots:
        return [], [state, *slots], "ordered"
    try:
        encoded = codec.dumps({"value": obj}, {})
    except Exception:
        return [repr(type(obj))], [], "ordered"
    digest = xxhash.xxh3_64(encoded.stream)
    for buffer in encoded.buffers:
        digest.update(buffer)
    return [digest.hexdigest()], [], "ordered"


_ATOM_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes, range,
                         type(Ellipsis)})


def _memory_of(obj: Any) -> list[str] | None:
    """An array's or tensor's dtype, shape and values (and a parameter's gradient)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray) and obj.dtype != object:
        data = np.ascontiguousarray(obj).view(np.uint8).tobytes() if obj.size else b""
        return [str(obj.dtype), str(obj.shape), xxhash.xxh3_64_hexdigest(data)]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        flat = obj.detach().cpu().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        grad = _memory_of(obj.grad) if obj.is_leaf and obj.requires_grad else None
        return [str(obj.dtype), str(tuple(obj.shape)), str(obj.requires_grad),
                xxhash.xxh3_64_hexdigest(data), "" if grad is None else grad[2]]
    return None


def _hash(kind: str, parts: list[str]) -> str:
    return xxhash.xxh3_64_hexdigest("\x00".join([kind, *parts]).encode(errors="surrogatepass"))


def _has_contents(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True

"""Co-variables: which variables share objects, and which globals their code reads.

Two variables that reach a common object must be saved and loaded together, or a later cell that
mutates one would not see it through the other. The walk follows `gc.get_referents`, treating
atoms (numbers, strings, types, modules, library functions) as leaves that never link two
variables, and array or tensor memory as one node keyed by its buffer, so views of one array
group with it. Notebook functions are walked through their defaults, closures and attributes but
not their globals (that is the namespace itself); their bytecode gives the global names they
load, which the closure analysis follows transitively. Numpy arrays of objects are walked through
their elements, which the garbage collector does not see.

Code also finds session names without loading them: pickle, `torch.save`, `joblib` and
`multiprocessing` save a class or function of `__main__` as its name and look it up there. So the
names of the notebook classes of the objects reached, and of the notebook functions and classes
reached themselves, count among the globals a variable's objects read. A notebook class owns its
methods and class attributes, so a variable that holds one of them groups with the class.

The walk also estimates each group's size in memory (a buffer counts once, by its bytes) and
notes the packages its objects' types and functions come from: the import closure a fresh worker
needs before it can rebuild them.
"""

from __future__ import annotations

import dis
import gc
import inspect
import sys
import types
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress, repeat
from operator import not_
from typing import Any, cast

_ATOMS = (type(None), bool, int, float, complex, str, bytes, type, types.ModuleType,
          types.BuiltinFunctionType, types.CodeType, range, type(Ellipsis))

_ATOM_TYPES = frozenset(_ATOMS)  # exact-type test first: cheap on lists of a million floats
_CONTAINER_TYPES = frozenset({list, tuple, dict, set, frozenset})

DEFAULT_BUDGET = 2_000_000  # objects visited in one grouping; past it, everything is one group


# Opcodes that read a global by name, and attribute names that reach the whole namespace.
_GLOBAL_READS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "DELETE_GLOBAL", "DELETE_NAME"})
_NAMESPACE_ATTRS = frozenset({"user_ns", "user_global_ns", "f_globals", "__main__"})
# Packages a fresh worker has anyway, or that are not packages at all.
_NOT_PACKAGES = frozenset({"__main__", "builtins", *sys.stdlib_module_names})


@dataclass(frozen=True)
class Grouping:
    groups: list[list[str]]
    refs: dict[str, set[str]]  # variable -> global names that code reachable from it reads
    bounded: bool  # the budget ran out: every variable was put in one group, to stay safe
    sizes: dict[str, int]  # variable -> bytes of the objects it reached first (estimate)
    packages: dict[str, set[str]]  # variable -> top-level packages its objects come from


@lru_cache(maxsize=8192)
def code_globals(code: types.CodeType) -> frozenset[str]:
    """The global names a code object (nested ones included) loads or deletes."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_READS}
    names.update(_NAMESPACE_ATTRS.intersection(code.co_names))
    if "__main__" in code.co_consts:  # sys.modules["__main__"]
        names.add("__main__")
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_globals(const)
    return frozenset(names)


def package_of(module: object) -> str | None:
    """The top-level package of a module name; None for the standard library and builtins."""
    if not isinstance(module, str):
        return None
    top = module.partition(".")[0]
    return None if top in _NOT_PACKAGES or top.startswith("_") else top


def packaged(modules: Iterable[object]) -> frozenset[str]:
    """The modules that count toward an import closure: those of a package, not the standard
    library's, which any worker imports in milliseconds."""
    return frozenset(m for m in modules if isinstance(m, str) and package_of(m) is not None)


def _nbytes(obj: Any, key: object) -> int:
    """Memory an object holds: its buffer's bytes for array memory, else its own size."""
    if isinstance(key, tuple):
        return int(key[2])
    try:
        return _sizer(type(obj))(obj)
    except TypeError:  # objects whose __sizeof__ is broken
        return 0


@lru_cache(maxsize=4096)
def _sizer(kind: type) -> Any:
    """`kind`'s own `__sizeof__` if it is built in, else object's: one written in Python is
    session code, which the walk must not run (a mock's makes a new mock on every call, and
    the walk would follow each into the next without end)."""
    method = inspect.getattr_static(kind, "__sizeof__", None)
    builtin = isinstance(method, types.WrapperDescriptorType | types.MethodDescriptorType)
    return method if builtin else object.__sizeof__


def _buffer_key(obj: Any) -> tuple | None:
    """Where the memory an array or tensor views starts, so that views of one block link
    (numpy views with their base, tensors with `torch.from_numpy` arrays)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        root = obj
        while isinstance(root.base, np.ndarray):
            root = root.base
        address = root.__array_interface__["data"][0]
        return ("buf", address, root.nbytes) if address and root.nbytes else None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.layout == torch.strided:
        try:
            storage = obj.untyped_storage()
        except RuntimeError:  # tensor subclasses without storage
            return None
        ptr = storage.data_ptr()
        return ("buf", ptr, storage.nbytes()) if ptr else None
    return None


class _Walker:
    def __init__(self, namespace: dict, budget: int) -> None:
        self.namespace = namespace
        self.budget = budget
        self.owner: dict[Any, str] = {}  # node key -> first variable that reached it
        self.parent: dict[str, str] = {}
        self.size = 0  # bytes reached by the current walk
        self.packages: set[str] = set()  # packages seen by the current walk
        np = sys.modules.get("numpy")
        self.arrays = (np.ndarray,) if np is not None else ()

    def find(self, name: str) -> str:
        while self.parent[name] != name:
            self.parent[name] = self.parent[self.parent[name]]
            name = self.parent[name]
        return name

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra

    def _class_refs(self, cls: type, refs: set[str]) -> None:
        for value in vars(cls).values():
            if isinstance(value, type) and (name := _main_name(value)) is not None:
                refs.add(name)  # a class attribute naming another notebook class
            for fn in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
                if isinstance(fn, types.FunctionType) and fn.__globals__ is self.namespace:
                    refs |= code_globals(fn.__code__)

    def walk(self, name: str, root: Any) -> set[str] | None:
        """Mark the nodes reachable from `root` as `name`'s; None when the budget ran out."""
        refs: set[str] = set()
        if (own := _main_name(root)) is not None:
            refs.add(own)  # a class or function of the notebook: found by its own name
        seen_types: set[int] = set()
        # batches: lists of builtin containers, claimed at once, with the set of their types
        stack: list = [root]
        batches: list[tuple[list, set[type]]] = []
        while stack or batches:
            if batches:
                if not self._claim_all(name, *batches.pop(), stack, batches):
                    return None
                continue
            obj = stack.pop()
            kind = type(obj)
            if kind in _CONTAINER_TYPES:  # the common case, first and without probing
                if self._claim(name, obj, id(obj)):
                    _route(gc.get_referents(obj), stack, batches)
                elif self.budget < 0:
                    return None
                continue
            if isinstance(obj, type):
                if id(obj) not in seen_types:
                    seen_types.add(id(obj))
                    self._note_type(obj, refs)
                    if obj is root and obj.__module__ == "__main__":
                        # a notebook class owns its methods and class attributes: a variable
                        # holding one (`jobs = [Ops.square]`) shares it with the class
                        _push(stack, list(vars(obj).values()))
                continue
            if isinstance(obj, _ATOMS) or obj is self.namespace:
                continue
            if isinstance(obj, types.FunctionType) and obj.__globals__ is not self.namespace:
                self._note_package(obj)
                continue  # a library function: pickled by reference, shared by no one
            if callable(obj) and not isinstance(obj, types.FunctionType) and _is_global(obj):
                self._note_package(obj)
                continue  # likewise a library's callable object (np.sum, np.add)
            if not self._claim(name, obj, _buffer_key(obj) or id(obj)):
                if self.budget < 0:
                    return None
                continue
            if isinstance(obj, types.FunctionType):
                refs |= code_globals(obj.__code__)
                if (own := _main_name(obj)) is not None:
                    refs.add(own)
                stack.extend(c.cell_contents for c in obj.__closure__ or () if _has_value(c))
                stack.extend((obj.__defaults__, obj.__kwdefaults__, obj.__dict__))
                continue
            stack.append(kind)
            _push_referents(stack, obj)
            if isinstance(obj, self.arrays) and obj.dtype.kind == "O":
                _push(stack, obj.ravel().tolist())  # an object array's elements
        return refs

    def _claim(self, name: str, obj: Any, key: Any) -> bool:
        """Record that `name` reaches the node `key`; True if the walk must go on through it."""
        other = self.owner.get(key)
        if other is not None:
            self.union(name, other)
            if other == name or self.find(other) == self.find(name):
                return False
        self.owner[key] = name
        self.size += _nbytes(obj, key)
        self.budget -= 1
        return self.budget >= 0

    def _claim_all(self, name: str, batch: list, kinds: set[type], stack: list,
                   batches: list) -> bool:
        """`_claim` for many builtin containers (a list of 100k dicts) in a few passes at C
        speed instead of a trip round the walk each; False when the budget ran out."""
        ids, owner = list(map(id, batch)), self.owner
        if owner.keys().isdisjoint(ids):  # the common case, all new: straight into the owners
            before = len(owner)
            owner.update(zip(ids, repeat(name)))
            # fewer new keys than objects: some object is in the batch twice, walk it once
            objects = batch if len(owner) - before == len(batch) else \
                list(dict(zip(ids, batch, strict=True)).values())
        else:
            fresh = dict(zip(ids, batch, strict=True))
            for key in list(filter(owner.__contains__, fresh)):  # reached before: linked,
                self.union(name, owner[key])  # not walked again
                del fresh[key]
            owner.update(dict.fromkeys(fresh, name))
            objects = list(fresh.values())
        if not objects:
            return True
        self.budget -= len(objects)
        if self.budget < 0:
            return False
        for kind in kinds:  # builtin containers: their own __sizeof__, as `_nbytes` takes it
            sizeof = cast(Callable[[object], int], kind.__sizeof__)  # unbound: takes the object
            self.size += sum(map(sizeof, objects if len(kinds) == 1
                                 else [o for o in objects if type(o) is kind]))
        _route(gc.get_referents(*objects), stack, batches)
        return True

    def _note_type(self, cls: type, refs: set[str]) -> None:
        if cls.__module__ == "__main__":
            if (name := _main_name(cls)) is not None:
                refs.add(name)
            self._class_refs(cls, refs)
            for base in cls.__mro__[1:]:  # a notebook class's library bases come from packages
                self._note_package(base)
        else:
            self._note_package(cls)

    def _note_package(self, obj: Any) -> None:
        if (package := package_of(getattr(obj, "__module__", None))) is not None:
            self.packages.add(package)


def _push_referents(stack: list, obj: Any) -> None:
    _push(stack, gc.get_referents(obj))


def _route(referents: list, stack: list, batches: list) -> None:
    """Like `_push`, but referents that are all builtin containers go as one batch, with
    their types (the batch's walk sizes them by type)."""
    kinds = set(map(type, referents))
    if not kinds.isdisjoint(_ATOM_TYPES):
        if kinds <= _ATOM_TYPES:
            return
        referents = _without_atoms(referents)
        kinds -= _ATOM_TYPES
    if kinds <= _CONTAINER_TYPES:
        batches.append((referents, kinds))
    else:
        stack.extend(referents)


def _push(stack: list, referents: list) -> None:
    """Push `referents`, but atoms; type sets are counted at C speed, so a list of a million
    floats costs one pass, not a million pushes."""
    kinds = set(map(type, referents))
    if kinds.isdisjoint(_ATOM_TYPES):
        stack.extend(referents)
    elif not kinds <= _ATOM_TYPES:
        stack.extend(_without_atoms(referents))


def _without_atoms(referents: list) -> list:
    # a pass at C speed: the walk meets lists of a million mixed items
    return list(compress(referents, map(not_, map(_ATOM_TYPES.__contains__, map(type, referents)))))


def _main_name(obj: Any) -> str | None:
    """The session variable pickle looks a class or function of `__main__` up by: the first part
    of its qualified name (`Model` for `Model.forward`); None for others and for local ones,
    which pickle cannot find by name anywhere."""
    if not isinstance(obj, (type, types.FunctionType)):
        return None
    qualname = getattr(obj, "__qualname__", None)
    if getattr(obj, "__module__", None) != "__main__" or not isinstance(qualname, str) \
            or "<locals>" in qualname:
        return None
    return qualname.partition(".")[0]


def _is_global(obj: Any) -> bool:
    """Whether `obj` is a library module's attribute of its own name: pickled by reference."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__name__", None)
    if not isinstance(module, str) or not isinstance(name, str) or module == "__main__":
        return False
    return getattr(sys.modules.get(module), name, None) is obj


def _has_value(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - probing an empty cell raises
    except ValueError:
        return False
    return True


def group_variables(namespace: dict[str, Any], names: list[str],
                    budget: int = DEFAULT_BUDGET, opaque: Collection[str] = ()) -> Grouping:
    """Partition `names` (variables of `namespace`) into groups of variables that share objects.
    `opaque`: those of `names` whose objects no other variable reaches but through their value
    itself (`snapshot.plain` proves it): not walked (no refs, no packages, size 0), but linked
    to any variable whose walk reaches the value."""
    walker = _Walker(namespace, budget)
    refs: dict[str, set[str]] = {}
    sizes: dict[str, int] = {}
    packages: dict[str, set[str]] = {}
    for name in opaque:
        walker.parent[name] = name
        walker.owner[id(namespace[name])] = name
    for name in names:
        if name in opaque:
            refs[name], sizes[name], packages[name] = set(), 0, set()
            continue
        walker.parent[name] = name
        walker.size, walker.packages = 0, set()
        found = walker.walk(name, namespace[name])
        if found is None:
            # Refs and packages are unknown too: "everything" is the only safe answer for them.
            return Grouping([list(names)], {n: set(names) for n in names}, True,
                            {n: 0 for n in names}, {n: set() for n in names})
        refs[name], sizes[name], packages[name] = found, walker.size, walker.packages
    by_root: dict[str, list[str]] = {}
    for name in names:
        by_root.setdefault(walker.find(name), []).append(name)
    return Grouping(list(by_root.values()), refs, False, sizes, packages)

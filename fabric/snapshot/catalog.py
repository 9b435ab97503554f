"""A version's catalog: what each of its names is, so that completion and inspection work on a
session no worker holds.

The worker describes the names a cell saved (`describe`: type, attributes, signature, docstring,
shape and dtype, a short repr; an instance's class once for all its instances), the commit
merges that into the parent's catalog (`merge`) and stores it as one blob the manifest names.
Every entry and the catalog are bounded, so a session of many or large values keeps a small
catalog. `complete` and `inspect` answer Jupyter's
`complete_request` and `inspect_request` from it, as a kernel would from live objects, one
attribute level deep.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect as pyinspect
import keyword
import re
import reprlib
import types
from collections.abc import Callable, Mapping, Sized
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar, cast

from ..errors import StoreError
from .packing import UnpackError, pack, unpack

FORMAT = 1
MAX_NAMES = 2000  # names a catalog describes
MAX_ATTRS = 1000  # attributes of one name, for `x.<Tab>`: public ones first
MAX_DOC = 1000  # characters of a docstring
MAX_TEXT = 200  # characters of a repr, a signature, a member's docstring
MAX_MEMBERS = 60  # public callables of one name whose signature and doc are kept
MAX_BYTES = 512 * 1024  # a catalog past this loses the members and docs of its largest entries
LIMIT = 16 << 20  # a stored catalog past this is none `merge` wrote: refused unread

Entry = dict[str, Any]
Catalog = dict[str, dict[str, Entry]]  # "names": name -> entry; "classes": class -> entry
Content = dict[str, Any]  # a Jupyter reply's content
Limit = Callable[[], AbstractContextManager[object]]  # a context that bounds the code it runs
EMPTY: Catalog = {"names": {}, "classes": {}}
T = TypeVar("T")


class _ShortRepr(reprlib.Repr):
    """reprlib's, with bytes clipped before `repr` runs, as it clips str: its own prints a
    100 MB bytes whole (a 400 MB string), then cuts it."""

    def repr_bytes(self, x: bytes, level: int) -> str:
        return self.repr_str(x, level)  # type: ignore[arg-type]  # slices bytes as it does str

    repr_bytearray = repr_bytes


_short = _ShortRepr()
_short.maxstring = _short.maxother = MAX_TEXT
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 10


def _attempt(limit: Limit, run: Callable[[], T]) -> T | None:
    """`run()`, which runs a value's own code (its repr, signature or `__dir__`), within
    `limit()` (the limit's block is this frame: see `fabric.worker.deadline`); None if it raises
    anything, `SystemExit` too or a TimeoutError past the limit, but the user's interrupt,
    which stops the save."""
    try:
        with limit():
            return run()
    except KeyboardInterrupt:
        raise
    except BaseException:  # left out, as the docstring says
        return None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _kind(value: object) -> str:
    """The kind Jupyter's completion metadata gives a name (told by its type: an instance's
    `__class__` is never read)."""
    if issubclass(type(value), types.ModuleType):
        return "module"
    if issubclass(type(value), type):
        return "class"
    if callable(value):
        return "function"
    return "instance"


# Reading a value's attributes runs no code of the user's (a `shape` property with side effects,
# a `__dir__` or `__getattr__` that never returns): they are read from the dicts of its class's
# MRO and its own, found without the class's metaclass, and run only where the code is C (a
# getset or member descriptor, as numpy's and torch's `shape` are) or a known library's.
_MRO: Callable[[type], tuple[type, ...]] = type.__dict__["__mro__"].__get__
_DICT: Callable[[type], Mapping[str, object]] = type.__dict__["__dict__"].__get__
_C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)
_KNOWN = frozenset({"numpy", "pandas", "torch", "jax", "jaxlib", "xarray", "polars", "scipy",
                    "cupy", "tensorflow"})
_MISSING = object()
_SIZED: tuple[type[Sized], ...] = (list, tuple, set, frozenset, dict, str, bytes, bytearray)


class _Descriptor(Protocol):
    def __get__(self, instance: object, owner: type, /) -> object: ...


def _classes(value: object) -> tuple[type, ...]:
    """The classes whose dicts hold `value`'s attributes: its own MRO if it is a class."""
    return _MRO(cast(type, value)) if issubclass(type(value), type) else _MRO(type(value))


def _own_dict(value: object) -> dict[str, object]:
    """`value.__dict__` where a C descriptor holds it, else {} (a property is never run)."""
    for cls in _MRO(type(value)):
        found = _DICT(cls).get("__dict__", _MISSING)
        if found is not _MISSING:
            if isinstance(found, _C_DESCRIPTORS):
                own: object = found.__get__(value, type(value))
                # an object's `__dict__`: its attributes by name
                return cast(dict[str, object], own) if isinstance(own, dict) else {}
            return {}
    return {}


def _fact(value: object, name: str) -> object:
    """`value.name` where reading it runs no code of the user's; None where it would."""
    found: object = _MISSING
    for cls in _MRO(type(value)):
        found = _DICT(cls).get(name, _MISSING)
        if found is _MISSING:
            continue
        if not hasattr(type(found), "__get__"):
            break  # a plain value: the instance's own, if it has one, comes first
        if isinstance(found, _C_DESCRIPTORS) or _known(cls):
            # a descriptor: its type has `__get__`, as checked above
            return cast(_Descriptor, found).__get__(value, type(value))
        return None
    return _own_dict(value).get(name, None if found is _MISSING else found)


def _known(cls: type) -> bool:
    """Whether `cls` is a known library's, whose attribute code runs in a bounded time."""
    return str(_DICT(cls).get("__module__", "")).partition(".")[0] in _KNOWN


def describe_one(value: object, classes: dict[str, Entry],
                 limit: Limit = contextlib.nullcontext) -> Entry:
    """One value's entry. An instance's class (its attributes, methods and docstring) is
    described once in `classes`, for all its instances; the entry keeps what is its own. Its
    signature and repr, which run its code, are read within `limit()`, else left out."""
    kind = type(value)
    entry: Entry = {"type": kind.__name__, "module": getattr(kind, "__module__", "") or "",
                    "kind": _kind(value)}
    attrs = _attrs(value, limit)
    if entry["kind"] == "instance":
        key = f"{entry['module']}.{kind.__qualname__}"
        if key not in classes:
            classes[key] = {"attrs": _attrs(kind), "members": _members(kind, True)}
            if doc := pyinspect.getdoc(kind):
                classes[key]["doc"] = _clip(doc, MAX_DOC)
        entry["class"] = key
        shared = set(classes[key]["attrs"])
        entry["attrs"] = [a for a in attrs if a not in shared]
    else:
        entry["attrs"] = attrs
        entry["members"] = _members(value, False)
        if doc := pyinspect.getdoc(value):
            entry["doc"] = _clip(doc, MAX_DOC)
    if callable(value):
        entry.update(_attempt(limit, lambda: _signature(value, bound=False)) or {})
    shape = dtype = None
    if entry["kind"] == "instance":
        shape, dtype = _fact(value, "shape"), _fact(value, "dtype")
    if isinstance(shape, tuple) and dtype is not None:
        entry["shape"] = [int(n) for n in cast(tuple[object, ...], shape) if isinstance(n, int)]
        entry["dtype"] = str(dtype)
    # arrays are told by shape and dtype, never printed here; a failing or endless repr: left out
    elif entry["kind"] == "instance" and \
            (text := _attempt(limit, lambda: _short.repr(value))) is not None:
        entry["repr"] = text
    for sized in _SIZED:
        if issubclass(kind, sized):  # the built-in length, never a subclass's `__len__`
            entry["len"] = sized.__len__(cast(Sized, value))  # an instance of `sized`
            break
    return entry


def _attrs(value: object, limit: Limit = contextlib.nullcontext) -> list[str]:
    """What `dir(value)` lists, public names first, bounded: read from the dicts, unless a
    known library's `__dir__` adds more (a DataFrame's columns), which runs within `limit()`."""
    names = set(_own_dict(value))
    for cls in _classes(value):
        names.update(_DICT(cls))
    owner = next((c for c in _MRO(type(value)) if "__dir__" in _DICT(c)), object)
    if _known(owner) and not issubclass(type(value), type):
        names.update(_attempt(limit, lambda: dir(value)) or ())
    attrs = sorted(str(a) for a in names)
    return ([a for a in attrs if not a.startswith("_")]
            + [a for a in attrs if a.startswith("_")])[:MAX_ATTRS]


def _signature(function: Any, bound: bool) -> Entry:
    """`{"signature": ...}`, without the first parameter if `bound`; {} if it has none."""
    try:
        signature = pyinspect.signature(function)
    except (TypeError, ValueError):
        return {}
    if bound and signature.parameters:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return {"signature": _clip(str(signature), MAX_TEXT)}


def _members(owner: object, instances: bool) -> dict[str, Entry]:
    """The signatures and docs of `owner`'s public callables (`thing.method(` + Shift+Tab),
    as its `instances` see them if so; read from the dicts, never by running a property."""
    members: dict[str, Entry] = {}
    for name in _attrs(owner):
        if len(members) >= MAX_MEMBERS or name.startswith("_"):
            break  # public names come first
        try:
            member: object = pyinspect.getattr_static(owner, name)
        except AttributeError:
            continue
        bound = instances and isinstance(member, types.FunctionType)
        if isinstance(member, (staticmethod, classmethod)):
            # what it wraps (isinstance leaves the types of a wrapper's function unknown)
            wrapper = cast("staticmethod[..., object] | classmethod[Any, ..., object]", member)
            member, bound = wrapper.__func__, isinstance(member, classmethod)
        if not callable(member):
            continue
        entry: Entry = {"kind": "function", "type": type(member).__name__,
                        **_signature(member, bound)}
        if doc := pyinspect.getdoc(member):
            entry["doc"] = _clip(doc.split("\n\n")[0], MAX_TEXT)
        members[name] = entry
    return members


def describe(namespace: dict[str, Any], names: list[str],
             limit: Limit = contextlib.nullcontext) -> Catalog:
    """The catalog of `names` in `namespace` (the first MAX_NAMES of them); what runs a value's
    code (its repr, its signature) runs within `limit()` (see `describe_one`), and a value that
    fails as it is read is described by its type alone."""
    entries: dict[str, Entry] = {}
    classes: dict[str, Entry] = {}
    for name in sorted(set(names))[:MAX_NAMES]:
        if name not in namespace:
            continue
        value = namespace[name]
        try:
            entries[name] = describe_one(value, classes, limit)
        except KeyboardInterrupt:
            raise  # the user stopped the save
        except BaseException:  # `SystemExit` from a hostile `__dir__` too: never the worker's end
            entries[name] = {"type": type(value).__name__, "kind": _kind(value), "attrs": []}
    return {"names": entries, "classes": classes}


def merge(parent: Catalog, fresh: Catalog, names: set[str]) -> Catalog:
    """The catalog of a version naming `names`: `fresh` entries over the parent's, the classes
    their instances name, and, past MAX_BYTES, the largest entries slimmed."""
    entries = {n: e for n, e in parent.get("names", {}).items() if n in names} | {
        n: e for n, e in fresh.get("names", {}).items() if n in names}
    entries = dict(sorted(entries.items())[:MAX_NAMES])
    used = {e.get("class") for e in entries.values()}
    classes = {k: c for k, c in (parent.get("classes", {}) | fresh.get("classes", {})).items()
               if k in used}
    merged = {"names": entries, "classes": classes}
    sizes = {(part, key): len(pack(e))
             for part, table in merged.items() for key, e in table.items()}
    total = sum(sizes.values())
    for part, key in sorted(sizes, key=sizes.__getitem__, reverse=True):
        if total <= MAX_BYTES:
            break
        slim = {k: v for k, v in merged[part][key].items() if k not in ("members", "doc")}
        slim["attrs"] = slim.get("attrs", [])[:100]
        merged[part][key] = slim
        total += len(pack(slim)) - sizes[part, key]
    return merged


def encode(catalog: Catalog) -> bytes:
    return pack({"format": FORMAT, **catalog})


def decode(data: bytes) -> Catalog:
    """A catalog read from the store, checked as input from outside."""
    try:
        raw = _map(unpack(data))
        if raw is None or raw.get("format") != FORMAT:
            raise ValueError(f"not a catalog of format {FORMAT}")
        for part in ("names", "classes"):
            table = _map(raw[part])
            if table is None or not all(
                    isinstance(k, str) and isinstance(v, dict) for k, v in table.items()):
                raise ValueError(f"its {part} are not a map of entries")
        # maps of entries by name, as checked
        return {"names": cast(dict[str, Entry], raw["names"]),
                "classes": cast(dict[str, Entry], raw["classes"])}
    except (KeyError, TypeError, ValueError, UnpackError) as exc:
        raise StoreError(f"malformed catalog: {exc}") from exc


def _map(value: object) -> dict[object, object] | None:
    """`value` if it is a map (of keys and values still to check), else None."""
    return cast(dict[object, object], value) if isinstance(value, dict) else None


def _entry(catalog: Catalog, name: str) -> Entry | None:
    """A name's entry with what its class says of it (attributes, methods, docstring)."""
    entry = catalog["names"].get(name)
    if entry is None or "class" not in entry:
        return entry
    cls = catalog["classes"].get(entry["class"], {})
    return {**cls, **entry, "attrs": [*entry.get("attrs", []), *cls.get("attrs", [])]}


# answering a frontend

_DOTTED = re.compile(r"(?:[A-Za-z_]\w*\.)*\w*$")  # `name.attr.pre` before the cursor
_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_GLOBALS = sorted(set(dir(builtins)) | set(keyword.kwlist))


def _visible(name: str, prefix: str) -> bool:
    """Private names only once the user typed their underscore, as IPython's completer does."""
    return name.startswith(prefix) and (prefix.startswith("_") or not name.startswith("_"))


def complete(catalog: Catalog, code: str, cursor: int) -> Content:
    """A `complete_reply`'s content for `code` with the cursor at `cursor`."""
    cursor = max(0, min(cursor, len(code)))
    match = _DOTTED.search(code[:cursor])
    base, dot, prefix = match.group().rpartition(".") if match else ("", "", "")
    start = cursor - len(prefix)
    before = code[:match.start()] if match else ""
    if match is None or before.endswith((".", "'", '"')):  # `3.`, `f().`, `d['k`: no name
        found: list[tuple[str, Entry | None]] = []
    elif dot:
        entry = _entry(catalog, base) or {}
        members = entry.get("members", {})
        found = [(a, members.get(a)) for a in entry.get("attrs", []) if _visible(a, prefix)]
    else:
        names = catalog["names"]
        found = [(n, names[n]) for n in names if _visible(n, prefix)]
        found += [(n, None) for n in _GLOBALS if _visible(n, prefix) and n not in names]
    found.sort(key=lambda item: item[0])
    types_ = [{"start": start, "end": cursor, "text": text,
               "type": (entry or {}).get("kind", ""),
               "signature": (entry or {}).get("signature", "")} for text, entry in found]
    return {"status": "ok", "matches": [text for text, _ in found], "cursor_start": start,
            "cursor_end": cursor, "metadata": {"_jupyter_types_experimental": types_}}


def name_at(code: str, cursor: int) -> str:
    """The dotted name the cursor is on or just after, else the callee of the call it is in."""
    cursor = max(0, min(cursor, len(code)))
    for match in _NAME.finditer(code):
        if match.start() <= cursor <= match.end():
            return match.group()
    depth = 0
    for i in range(cursor - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(code[i], 0)
        if depth < 0:
            match = re.search(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\s*$", code[:i])
            return match.group().strip() if match else ""
    return ""


def inspect(catalog: Catalog, code: str, cursor: int) -> Content:
    """An `inspect_reply`'s content: the catalog's entry for the name at the cursor."""
    name = name_at(code, cursor)
    base, _, attr = name.rpartition(".")
    entry = _entry(catalog, name) or (_entry(catalog, base) or {}).get("members", {}).get(attr)
    if entry is None:
        return {"status": "ok", "found": False, "data": {}, "metadata": {}}
    rows = [("Type", entry.get("type", ""))]
    for key, label in (("repr", "String form"), ("len", "Length"), ("shape", "Shape"),
                       ("dtype", "Dtype"), ("signature", "Signature")):
        if key in entry:
            value = entry[key]
            rows.append((label, name + value if key == "signature" else
                         str(tuple(value)) if key == "shape" else str(value)))
    if entry.get("doc"):
        rows.append(("Docstring" if entry.get("kind") != "instance" else "Class docstring",
                     entry["doc"]))
    text = "\n".join(f"{label + ':':<16}{value}" for label, value in rows)
    return {"status": "ok", "found": True, "data": {"text/plain": text}, "metadata": {}}


def variables(catalog: Catalog) -> list[dict[str, Any]]:
    """The session's values as a debugger's variables panel lists them (the Jupyter debug
    protocol's `inspectVariables`): each name, its type, and its short repr where one was
    kept."""
    rows: list[dict[str, Any]] = []
    for name in sorted(catalog["names"]):
        entry = catalog["names"][name]
        value = entry.get("repr")
        if value is None and "shape" in entry:
            value = f"{entry['type']} of shape {tuple(entry['shape'])}, {entry.get('dtype')}"
        rows.append({"name": name, "value": value if value is not None else
                     f"<{entry.get('type', 'object')}>", "type": entry.get("type", ""),
                     "evaluateName": name, "variablesReference": 0})
    return rows

"""A version's catalog: what each of its names is, so that completion and inspection work on a
session no worker holds.

The worker describes the names a cell saved (`describe`: type, attributes, signature, docstring,
shape and dtype, a short repr), the commit merges that into the parent's catalog (`merge`) and
stores it as one blob the manifest names. Every entry and the catalog are bounded, so a session
of many or large values keeps a small catalog. `complete` and `inspect` answer Jupyter's
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
from typing import Any

import msgpack

from ..errors import StoreError

FORMAT = 1
MAX_NAMES = 2000  # names a catalog describes
MAX_ATTRS = 1000  # attributes of one name, for `x.<Tab>`: public ones first
MAX_DOC = 1000  # characters of a docstring
MAX_TEXT = 200  # characters of a repr, a signature, a member's docstring
MAX_MEMBERS = 60  # public callables of one name whose signature and doc are kept
MAX_BYTES = 512 * 1024  # a catalog past this loses the members and docs of its largest entries

Entry = dict[str, Any]
_short = reprlib.Repr()
_short.maxstring = _short.maxother = MAX_TEXT
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 10


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _kind(value: object) -> str:
    """The kind Jupyter's completion metadata gives a name."""
    if isinstance(value, types.ModuleType):
        return "module"
    if isinstance(value, type):
        return "class"
    if callable(value):
        return "function"
    return "instance"


def describe_one(value: object) -> Entry:
    """One value's entry; what cannot be read of it (a failing `__dir__`, say) is left out."""
    kind = type(value)
    entry: Entry = {"type": kind.__name__, "module": getattr(kind, "__module__", "") or "",
                    "kind": _kind(value)}
    try:
        attrs = sorted(str(a) for a in dir(value))
    except Exception:  # user code: whatever it raises only leaves the attributes out
        attrs = []
    entry["attrs"] = ([a for a in attrs if not a.startswith("_")]
                      + [a for a in attrs if a.startswith("_")])[:MAX_ATTRS]
    if callable(value):
        entry.update(_signature(value, bound=False))
    entry["members"] = _members(value, entry["attrs"])
    doc = pyinspect.getdoc(value) if entry["kind"] != "instance" else pyinspect.getdoc(kind)
    if doc:
        entry["doc"] = _clip(doc, MAX_DOC)
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None and not isinstance(value, type):
        entry["shape"] = [int(n) for n in shape if isinstance(n, int)]
        entry["dtype"] = str(dtype)
    elif entry["kind"] == "instance":  # arrays are told by shape and dtype, never printed here
        with contextlib.suppress(Exception):  # user code: a failing repr leaves it out
            entry["repr"] = _short.repr(value)
    if isinstance(value, (list, tuple, set, frozenset, dict, str, bytes)):
        entry["len"] = len(value)
    return entry


def _signature(function: Any, bound: bool) -> Entry:
    """`{"signature": ...}`, without the first parameter if `bound`; {} if it has none."""
    try:
        signature = pyinspect.signature(function)
    except (TypeError, ValueError):
        return {}
    if bound and signature.parameters:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return {"signature": _clip(str(signature), MAX_TEXT)}


def _members(value: object, attrs: list[str]) -> dict[str, Entry]:
    """The signatures and docs of `value`'s public callables (`thing.method(` + Shift+Tab),
    read from the class dicts, never by running a property."""
    members: dict[str, Entry] = {}
    instance = not isinstance(value, (type, types.ModuleType))
    for name in attrs:
        if len(members) >= MAX_MEMBERS:
            break
        if name.startswith("_"):
            continue
        try:
            member = pyinspect.getattr_static(value, name)
        except AttributeError:
            continue
        bound = instance and isinstance(member, types.FunctionType)
        if isinstance(member, (staticmethod, classmethod)):
            member, bound = member.__func__, isinstance(member, classmethod)
        if not callable(member):
            continue
        entry: Entry = {"kind": "function", "type": type(member).__name__,
                        **_signature(member, bound)}
        if doc := pyinspect.getdoc(member):
            entry["doc"] = _clip(doc.split("\n\n")[0], MAX_TEXT)
        members[name] = entry
    return members


def describe(namespace: dict[str, Any], names: list[str]) -> dict[str, Entry]:
    """The entries of `names` in `namespace` (the first MAX_NAMES of them); a value whose own
    code fails as it is read (a property of its class, say) is described by its type alone."""
    entries = {}
    for name in sorted(set(names))[:MAX_NAMES]:
        if name not in namespace:
            continue
        value = namespace[name]
        try:
            entries[name] = describe_one(value)
        except Exception:
            entries[name] = {"type": type(value).__name__, "kind": "instance", "attrs": []}
    return entries


def merge(parent: dict[str, Entry], fresh: dict[str, Entry], names: set[str]) -> dict[str, Entry]:
    """The catalog of a version naming `names`: `fresh` entries over the parent's."""
    merged = {n: e for n, e in parent.items() if n in names} | {
        n: e for n, e in fresh.items() if n in names}
    merged = dict(sorted(merged.items())[:MAX_NAMES])
    sizes = {n: len(msgpack.packb(e, use_bin_type=True)) for n, e in merged.items()}
    total = sum(sizes.values())
    for name in sorted(sizes, key=sizes.__getitem__, reverse=True):
        if total <= MAX_BYTES:
            break
        slim = {k: v for k, v in merged[name].items() if k not in ("members", "doc")}
        slim["attrs"] = slim.get("attrs", [])[:100]
        merged[name] = slim
        total += len(msgpack.packb(slim, use_bin_type=True)) - sizes[name]
    return merged


def encode(catalog: dict[str, Entry]) -> bytes:
    return msgpack.packb({"format": FORMAT, "names": catalog}, use_bin_type=True)


def decode(data: bytes) -> dict[str, Entry]:
    """A catalog read from the store, checked as input from outside."""
    try:
        raw = msgpack.unpackb(data, raw=False)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"not a catalog of format {FORMAT}")
        names = raw["names"]
        if not isinstance(names, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) for k, v in names.items()):
            raise ValueError("its names are not a map of entries")
        return names
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
        raise StoreError(f"malformed catalog: {exc}") from exc


# answering a frontend

_DOTTED = re.compile(r"(?:[A-Za-z_]\w*\.)*\w*$")  # `name.attr.pre` before the cursor
_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_GLOBALS = sorted(set(dir(builtins)) | set(keyword.kwlist))


def _visible(name: str, prefix: str) -> bool:
    """Private names only once the user typed their underscore, as IPython's completer does."""
    return name.startswith(prefix) and (prefix.startswith("_") or not name.startswith("_"))


def complete(catalog: dict[str, Entry], code: str, cursor: int) -> dict:
    """A `complete_reply`'s content for `code` with the cursor at `cursor`."""
    cursor = max(0, min(cursor, len(code)))
    match = _DOTTED.search(code[:cursor])
    base, dot, prefix = match.group().rpartition(".") if match else ("", "", "")
    start = cursor - len(prefix)
    if match is None or code[:match.start()].endswith("."):  # `3.`, `f().`: no name to look up
        found = []
    elif dot:
        entry = catalog.get(base) or {}
        members = entry.get("members", {})
        found = [(a, members.get(a)) for a in entry.get("attrs", []) if _visible(a, prefix)]
    else:
        found = [(n, catalog[n]) for n in catalog if _visible(n, prefix)]
        found += [(n, None) for n in _GLOBALS if _visible(n, prefix) and n not in catalog]
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


def inspect(catalog: dict[str, Entry], code: str, cursor: int) -> dict:
    """An `inspect_reply`'s content: the catalog's entry for the name at the cursor."""
    name = name_at(code, cursor)
    base, _, attr = name.rpartition(".")
    entry = catalog.get(name) or (catalog.get(base) or {}).get("members", {}).get(attr)
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

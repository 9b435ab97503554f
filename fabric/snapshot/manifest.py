"""A manifest: one committed version of a session.

It maps each variable to the group (blob) that holds it, records module aliases as imports to
redo rather than objects to pickle, the global names each variable's code refers to (for
transitive closures), and the ambient state blob. Manifests are plain data: msgpack on disk,
validated field by field when read, since the store is input from outside.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import msgpack  # pyright: ignore[reportMissingTypeStubs]

from ..errors import StoreError

FORMAT = 1


@dataclass(frozen=True)
class Group:
    """Variables that share objects, saved and loaded together so aliasing survives.

    `names` may be a subset of what the blob holds: a later cell can rebind one member of a group
    it did not load; the others still come from the old blob.
    """

    blob: str
    names: tuple[str, ...]
    size: int = 0
    device: bool = False  # it holds CUDA memory: on a GPU host it loads under the cell's lease


@dataclass(frozen=True)
class Manifest:
    session: str
    version: int = 0
    parent: str | None = None
    groups: tuple[Group, ...] = ()
    imports: dict[str, str] = field(default_factory=dict[str, str])  # alias -> module name
    # var -> globals its code reads
    refs: dict[str, tuple[str, ...]] = field(default_factory=dict[str, tuple[str, ...]])
    # var -> what rebuilds it
    packages: dict[str, tuple[str, ...]] = field(default_factory=dict[str, tuple[str, ...]])
    ambient: str | None = None
    modules: tuple[str, ...] = ()  # modules the session's cells imported: its zygote family
    hooks: tuple[str, ...] = ()  # import hooks the notebook defined (`ambient.notebook_hooks`)
    # execution_count, status, source hash
    cell: dict[str, Any] = field(default_factory=dict[str, Any])
    catalog: str | None = None  # the blob describing its names (`snapshot.catalog`)
    # the environment its cell ran in: {"name", "packages": {name: version}}; {}: the server's
    env: dict[str, Any] = field(default_factory=dict[str, Any])

    def variables(self) -> dict[str, Group]:
        return {name: g for g in self.groups for name in g.names}

    def names(self) -> set[str]:
        return set(self.variables()) | set(self.imports)

    def blobs(self) -> list[str]:
        """The plain blobs it names besides its groups' objects."""
        return [b for b in (self.ambient, self.catalog) if b]

    def encode(self) -> bytes:
        return cast(bytes, msgpack.packb(  # pyright: ignore[reportUnknownMemberType]
            {
                "format": FORMAT,
                "session": self.session,
                "version": self.version,
                "parent": self.parent,
                "groups": [[g.blob, list(g.names), g.size, g.device] for g in self.groups],
                "imports": self.imports,
                "refs": {k: list(v) for k, v in self.refs.items()},
                "packages": {k: list(v) for k, v in self.packages.items()},
                "ambient": self.ambient,
                "modules": list(self.modules),
                "hooks": list(self.hooks),
                "cell": self.cell,
                "catalog": self.catalog,
                "env": self.env,
            },
            use_bin_type=True,
        ))

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        try:
            raw = _map(cast(object, msgpack.unpackb(  # pyright: ignore[reportUnknownMemberType]
                data, raw=False)))
            if raw.get("format") != FORMAT:
                raise ValueError(f"not a manifest of format {FORMAT}")
            groups = tuple(_group(entry) for entry in _list(raw["groups"]))
            return cls(
                session=_str(raw["session"]),
                version=_int(raw["version"]),
                parent=None if raw["parent"] is None else _str(raw["parent"]),
                groups=groups,
                imports={_str(k): _str(v) for k, v in _map(raw["imports"]).items()},
                refs=_names_by_variable(raw["refs"]),
                packages=_names_by_variable(raw.get("packages", {})),  # absent before 0.2
                ambient=None if raw["ambient"] is None else _str(raw["ambient"]),
                modules=tuple(_str(m) for m in _list(raw["modules"])),
                hooks=tuple(_str(h) for h in _list(raw.get("hooks", []))),  # older: none
                cell={_str(k): v for k, v in _map(raw["cell"]).items()},
                catalog=None if raw.get("catalog") is None else _str(raw["catalog"]),  # older: none
                env=_env(raw.get("env", {})),  # older: the server's own
            )
        except (KeyError, TypeError, ValueError, AttributeError, msgpack.UnpackException) as exc:
            raise StoreError(f"malformed manifest: {exc}") from exc


def _env(raw: object) -> dict[str, Any]:
    found = _map(raw)
    if not found:
        return {}
    return {"name": _str(found["name"]),
            "packages": {_str(k): _str(v) for k, v in _map(found["packages"]).items()}}


def _names_by_variable(raw: object) -> dict[str, tuple[str, ...]]:
    return {_str(k): tuple(_str(x) for x in _list(v)) for k, v in _map(raw).items()}


def _group(entry: object) -> Group:
    """[blob, names, bytes, device]; older manifests have no device."""
    blob, names, size, *rest = _list(entry)
    device = rest.pop() if rest else False
    if rest or not isinstance(device, bool):
        raise TypeError(f"a group's device must be true or false, not {device!r}")
    return Group(_str(blob), tuple(_str(n) for n in _list(names)), _int(size), device)


def _map(value: object) -> dict[object, object]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a map, got {type(value).__name__}")
    return cast(dict[object, object], value)


def _list(value: object) -> list[object]:
    # a string is iterable too: names "xy" must not decode as the variables "x" and "y"
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return cast(list[object], value)


def _int(value: object) -> int:
    return int(cast(Any, value))  # what int() refuses raises TypeError or ValueError


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value

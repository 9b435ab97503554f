"""The closure of a cell: the groups and module aliases a fresh worker must hold to run it.

A pure function of the cell's source and the session's latest manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..snapshot.manifest import Group, Manifest
from .groups import package_of
from .static import CODE_DYNAMIC, analyze


@dataclass(frozen=True)
class Closure:
    names: frozenset[str]  # session variables and aliases the cell may read
    groups: tuple[Group, ...]
    imports: dict[str, str]  # alias -> module, re-imported rather than unpickled
    modules: frozenset[str]  # the import closure (the standard library aside, which any worker
    # imports in milliseconds): what the worker's zygote or template must have imported
    whole: bool  # static analysis could not bound the cell: the whole session is loaded
    exact: bool  # False when the source did not parse (a draft being edited)
    forced_by: str = ""  # whole: the construct that forced it, and where


def closure(source: str, manifest: Manifest) -> Closure:
    cell = analyze(source)
    variables = manifest.variables()
    session = set(variables) | set(manifest.imports)
    forced_by = f"the cell uses {cell.forced_by}" if cell.dynamic else ""
    if not forced_by:
        seeds = set(cell.reads) & session
        if cell.unpickles:
            seeds |= definitions(manifest) & session
        needed = _reach(seeds, manifest, session)
        forced_by = _unbounded(needed, manifest)
    if forced_by:
        needed = set(session)
    groups = {(g.blob, g.names): g for name in needed if (g := variables.get(name)) is not None}
    imports = {a: m for a, m in manifest.imports.items() if a in needed}
    modules = {m for m in (*cell.imports, *imports.values()) if package_of(m) is not None}
    for name in needed:
        modules.update(manifest.packages.get(name, ()))
    return Closure(frozenset(needed), tuple(groups.values()), imports, frozenset(modules),
                   bool(forced_by), cell.parsed, forced_by)


def definitions(manifest: Manifest) -> set[str]:
    """The session's classes and functions: the variables whose objects pickle looks up by the
    variable's own name (their refs name themselves). Unpickled data may need any of them."""
    return {name for name, refs in manifest.refs.items() if name in refs}


def _unbounded(names: set[str], manifest: Manifest) -> str:
    """Why `names` can reach any global (code that evals or reads globals(), a variable bound
    to the `__main__` module), or ""."""
    for name in sorted(names):
        if constructs := CODE_DYNAMIC.intersection(manifest.refs.get(name, ())):
            return f"the code of {name!r} reads {min(constructs)}"
        if manifest.imports.get(name) == "__main__":
            return f"{name!r} is the __main__ module"
    return ""


def _reach(seeds: set[str], manifest: Manifest, session: set[str]) -> set[str]:
    """Group mates come along, and what code reads or pickle looks up, transitively."""
    variables = manifest.variables()
    needed, frontier = set(seeds), list(seeds)
    while frontier:
        name = frontier.pop()
        group = variables.get(name)
        for other in (*manifest.refs.get(name, ()), *(group.names if group else ())):
            if other in session and other not in needed:
                needed.add(other)
                frontier.append(other)
    return needed

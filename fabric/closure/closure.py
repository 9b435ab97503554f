"""The closure of a cell: the groups and module aliases a fresh worker must hold to run it.

A pure function of the cell (its analysis and the modules it imports) and the session's latest
version, both read through the small protocols below: a snapshot manifest is such a version, but
nothing here depends on how the store keeps one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .groups import packaged
from .static import CODE_DYNAMIC, CellAnalysis


class StoredGroup(Protocol):
    """Variables saved together: the blob that holds them and the names it binds."""

    @property
    def blob(self) -> str: ...

    @property
    def names(self) -> tuple[str, ...]: ...


G = TypeVar("G", bound=StoredGroup, covariant=True)


class State(Protocol[G]):
    """A session version as closures read it."""

    @property
    def imports(self) -> Mapping[str, str]: ...  # alias -> module

    @property
    def refs(self) -> Mapping[str, tuple[str, ...]]: ...  # variable -> globals its code reads

    @property
    def packages(self) -> Mapping[str, tuple[str, ...]]: ...  # variable -> what rebuilds it

    @property
    def hooks(self) -> tuple[str, ...]: ...  # import hooks the notebook defined

    def variables(self) -> Mapping[str, G]: ...  # variable -> its group


class AnalysedCell(Protocol):
    """A cell as closures read it: its analysis, and the imports that count (`packaged`)."""

    @property
    def analysis(self) -> CellAnalysis: ...

    @property
    def modules(self) -> frozenset[str]: ...


@dataclass(frozen=True)
class Closure(Generic[G]):
    names: frozenset[str]  # session variables and aliases the cell may read
    groups: tuple[G, ...]  # the state's own groups that hold them
    imports: dict[str, str]  # alias -> module, re-imported rather than unpickled
    modules: frozenset[str]  # the import closure (the standard library aside, which any worker
    # imports in milliseconds): what the worker's zygote or template must have imported
    whole: bool  # static analysis could not bound the cell: the whole session is loaded
    exact: bool  # False when the source did not parse (a draft being edited)
    forced_by: str = ""  # whole: the construct that forced it, and where
    # groups of `groups` only reads in a branch the cell may not take need, each with those
    # reads: a worker that runs the cell at once may load them when such a read comes
    lazy: tuple[tuple[G, frozenset[str]], ...] = ()


def closure(cell: AnalysedCell, state: State[G]) -> Closure[G]:
    analysis = cell.analysis
    variables = state.variables()
    session = set(variables) | set(state.imports)
    forced_by = f"the cell uses {analysis.forced_by}" if analysis.dynamic else ""
    if state.hooks and not forced_by:  # any import, in the cell or in code it calls, runs them
        forced_by = f"an import hook the notebook defined ({state.hooks[0]}) may read any global"
    eager: set[str] = set()
    later: dict[str, set[str]] = {}  # a read made only in a branch -> what it alone needs
    if not forced_by:
        seeds = set(analysis.reads - analysis.maybe) & session
        if analysis.unpickles:
            seeds |= definitions(state) & session
        eager = _reach(seeds, state, session)
        later = {read: _reach({read}, state, session) - eager
                 for read in analysis.maybe & session}
        needed = eager.union(*later.values())
        forced_by = _unbounded(needed, state)
    if forced_by:
        needed = eager = set(session)
    groups = {(g.blob, g.names): g for name in needed if (g := variables.get(name)) is not None}
    lazy = tuple((g, frozenset(r for r, names in later.items() if names.intersection(g.names)))
                 for g in groups.values() if eager.isdisjoint(g.names))
    imports = {a: m for a, m in state.imports.items() if a in needed}
    modules = set(cell.modules | packaged(imports.values()))
    for name in needed:
        modules.update(state.packages.get(name, ()))
    return Closure(frozenset(needed), tuple(groups.values()), imports, frozenset(modules),
                   bool(forced_by), analysis.parsed, forced_by, lazy)


def definitions(state: State) -> set[str]:
    """The session's classes and functions: the variables whose objects pickle looks up by the
    variable's own name (their refs name themselves). Unpickled data may need any of them."""
    return {name for name, refs in state.refs.items() if name in refs}


def _unbounded(names: set[str], state: State) -> str:
    """Why `names` can reach any global (code that evals or reads globals(), a variable bound
    to the `__main__` module), or ""."""
    for name in sorted(names):
        if constructs := CODE_DYNAMIC.intersection(state.refs.get(name, ())):
            return f"the code of {name!r} reads {min(constructs)}"
        if state.imports.get(name) == "__main__":
            return f"{name!r} is the __main__ module"
    return ""


def _reach(seeds: set[str], state: State, session: set[str]) -> set[str]:
    """Group mates come along, and what code reads or pickle looks up, transitively."""
    variables = state.variables()
    needed, frontier = set(seeds), list(seeds)
    while frontier:
        name = frontier.pop()
        group = variables.get(name)
        for other in (*state.refs.get(name, ()), *(group.names if group else ())):
            if other in session and other not in needed:
                needed.add(other)
                frontier.append(other)
    return needed

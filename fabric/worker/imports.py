"""What a worker imported on first use: the modules its zygote should hold next time.

Libraries import parts of themselves only when first used: torch wraps an optimizer's methods
so that the first call imports torch._dynamo (some 800 modules, a second or more). A zygote that
imported the library never made that call, so every worker forked from it pays for the import
in the cell that first does. After each cell the worker names what it imported since the last
(its loads' imports too) that the cell's own import statements did not bring; the server
remembers that per zygote family and has the family's zygotes import it (`pool.preloads`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType

from ..closure.groups import package_of

RUNTIME = __name__.partition(".")[0]  # the worker's own package: it chooses its own imports


class FirstUse:
    def __init__(self) -> None:
        self.known = set(sys.modules)  # what the worker started with: its zygote's
        # where its zygote finds modules: a notebook's own folder, added later, is not there
        self.path = list(sys.path)

    def since(self, own: Iterable[str]) -> list[str]:
        """The packages' modules imported since the last call (or the start) that a zygote
        could import too, but for those the cell's `own` import statements brought; of a
        package and its submodules only the package (importing it imports most of them)."""
        now = set(sys.modules)
        fresh = {m for m in now - self.known if package_of(m) not in (None, RUNTIME)}
        self.known = now
        brought = {m for m in own if m in fresh}
        if brought:  # a package the cell imported may have imported others: theirs, not first uses
            fresh = {m for m in fresh if m.partition(".")[0] not in fresh
                     and not any(m == b or m.startswith(f"{b}.") for b in brought)}
        fresh = {m for m in fresh if self._findable(m)}
        return sorted(m for m in fresh if not any(p in fresh for p in _parents(m)))

    def _findable(self, name: str) -> bool:
        """Whether a zygote would import the very package `name` belongs to."""
        package = name.partition(".")[0]
        top = sys.modules.get(package)
        if not isinstance(top, ModuleType):  # an object a library put there: no package
            return False
        loaded = top.__dict__.get("__spec__")  # read without running a module's own code
        found = PathFinder.find_spec(package, self.path)
        return isinstance(loaded, ModuleSpec) and found is not None \
            and _where(found) == _where(loaded)


def _where(spec: ModuleSpec) -> tuple[str | None, list[str]]:
    return spec.origin, list(spec.submodule_search_locations or ())


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]

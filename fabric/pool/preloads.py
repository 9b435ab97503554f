"""Preloads: what each zygote family's workers imported on first use, for its zygotes to hold.

Workers name the modules their cells' libraries imported on first use (`worker.imports`); a
family's zygote imports them besides the family, so that the next workers forked from it start
with them (`Pool._build`). Bounded per family and in families, since the names come from
workers, which run users' code; a name a zygote could not import, or one of a build that failed,
is never preloaded again.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import TypeGuard

from ..closure.groups import package_of

MODULES = 256  # a family's most: no notebook makes a zygote import without end
FAMILIES = 64  # remembered; the least recently taught goes first
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

Family = tuple[str, frozenset[str]]  # (environment's site-packages or "", import family)


class Preloads:
    def __init__(self) -> None:
        self._learned: OrderedDict[Family, set[str]] = OrderedDict()
        self._refused: dict[Family, set[str]] = {}

    def learn(self, family: Family, modules: Iterable[object]) -> bool:
        """Remember `modules` for `family`, but for names no zygote should import (not a
        package's module, a `__main__`); whether any was new."""
        known = self._learned.setdefault(family, set())
        self._learned.move_to_end(family)
        refused = self._refused.get(family, set())
        new = {m for m in modules if _importable(m)} - known - refused
        new = set(sorted(new)[:MODULES - len(known)])
        known |= new
        while len(self._learned) > FAMILIES:
            self._refused.pop(self._learned.popitem(last=False)[0], None)
        return bool(new)

    def refuse(self, family: Family, modules: Iterable[str]) -> None:
        """Never preload `modules` for `family` again: a zygote failed to import them."""
        if family in self._learned:
            self._refused.setdefault(family, set()).update(modules)
            self._learned[family] -= self._refused[family]

    def of(self, family: Family) -> frozenset[str]:
        return frozenset(self._learned.get(family, ()))


def _importable(name: object) -> TypeGuard[str]:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None \
        and package_of(name) is not None and "__main__" not in name.split(".")

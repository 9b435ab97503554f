"""How to rebuild the values a version holds but could not save: its lineage.

Every manifest records its cell's source, status and the names left unsaved after it. The values
the head could not save are rebuilt by loading the newest earlier version that saved everything
(its state and its ambient state, RNG states included) and re-running, in order, every cell since
then: the chain ran on exactly that state, so running it again reproduces what it made, as long
as it is deterministic and has no effect outside the session (`closure.effects`). The worker
compares what the replay left in every saved name with the head (see `Worker.settle`): a
difference means the replay did not reproduce the chain, and its unsaved values are not trusted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..closure.effects import unsafe
from ..errors import NotReplayable
from .manifest import Manifest
from .store import Store

MAX_CELLS = 50  # a longer chain costs more than the user would wait for, unasked
# Before a session's first cell no RNG state was recorded: a chain from there is replayed only
# when it cannot draw random numbers (conservatively, by the words it uses).
RANDOM = re.compile(r"rand|seed|shuffle|sample|choice|torch|numpy|np\.|tensorflow|tf\.|jax|"
                     r"sklearn|uuid|time|secrets", re.IGNORECASE)


@dataclass(frozen=True)
class Replay:
    names: list[str]  # the values it rebuilds
    start: Manifest  # the version the chain first ran on: it saved everything
    # the chain's cell records (source, status, execution_count), oldest first
    cells: list[dict[str, Any]]

    @property
    def seconds(self) -> float:
        """What the chain took to run the first time (its replay's expected cost)."""
        return sum(float(c.get("run") or 0.0) for c in self.cells)


def unsaved(store: Store, head: Manifest) -> tuple[Manifest, list[str]]:
    """The version whose cell made `head`'s state (a checkout's source version), and the names
    it could not save."""
    made = _made(store, head)
    return made, sorted(map(str, made.cell.get("unsaved") or ()))


def plan(store: Store, head: Manifest) -> Replay | None:
    """How to rebuild what `head` could not save; None if it saved everything. Raises
    NotReplayable when it cannot be rebuilt safely."""
    made, names = unsaved(store, head)
    if not names:
        return None
    chain: list[dict[str, Any]] = []
    current = made
    while True:
        chain.append(current.cell)
        if len(chain) > MAX_CELLS:
            raise NotReplayable(f"they were made over more than {MAX_CELLS} cells")
        if current.parent is None:
            start = Manifest(session=head.session)
            if any(RANDOM.search(str(c.get("source", ""))) for c in chain):
                raise NotReplayable("their cells may draw random numbers, and the session's "
                                    "random state before its first cell is not recorded")
            break
        parent = _made(store, Manifest.decode(store.get_manifest(current.parent)))
        if not parent.cell.get("unsaved"):
            start = parent
            break
        current = parent
    chain.reverse()
    aliases = start.imports | head.imports
    for cell in chain:
        if why := unsafe(str(cell.get("source", "")), aliases):
            raise NotReplayable(f"cell {cell.get('execution_count', '?')} {why}, so it is not "
                                "run again unasked")
    return Replay(names, start, chain)


def _made(store: Store, manifest: Manifest) -> Manifest:
    """The version whose cell made `manifest`'s state: a checkout copies another version's
    state (its ambient state too), not its cell record."""
    if "checkout" not in manifest.cell:
        return manifest
    if int(manifest.cell["checkout"]) == 0:  # the empty state before the first cell (a restart)
        return Manifest(session=manifest.session)
    return _version(store, manifest, int(manifest.cell["checkout"]))


def _version(store: Store, head: Manifest, version: int) -> Manifest:
    current = head
    while current.version != version:
        if current.parent is None:
            raise NotReplayable(f"version {version} is not in the session's history")
        current = Manifest.decode(store.get_manifest(current.parent))
    return current

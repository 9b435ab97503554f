"""A cell's plan: its source analysed once, and what follows from that analysis alone.

The server (a cell's closure, the modules its version records), the worker (which groups its save
may keep) and the history (which cells reached a value) all ask the same questions of a cell's
source. They ask its plan, made once per source text, so they cannot answer them differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .groups import packaged
from .static import CellAnalysis, analyze


@dataclass(frozen=True)
class CellPlan:
    source: str  # as the user wrote it
    analysis: CellAnalysis
    modules: frozenset[str]  # what it imports that counts toward an import closure
    reached: frozenset[str] | None  # the names it reads or writes; None: it may reach any


@lru_cache(maxsize=1024)
def plan(source: str) -> CellPlan:
    """The plan of `source`; the same object for the same text while it is cached."""
    analysis = analyze(source)
    bounded = analysis.parsed and not analysis.dynamic
    return CellPlan(source, analysis, packaged(analysis.imports),
                    analysis.reads | analysis.writes if bounded else None)

"""Closure analysis: what a cell needs from its session (pure functions, no processes)."""

from .closure import Closure, closure
from .groups import Grouping, group_variables
from .static import CellAnalysis, analyze

__all__ = ["CellAnalysis", "Closure", "Grouping", "analyze", "closure", "group_variables"]

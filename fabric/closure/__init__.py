"""Closure analysis: what a cell needs from its session.

Pure functions of plain data (a cell's source, a session version read through `State`, an object
graph): no processes, and nothing from the store, whose manifests satisfy `State` as they are.
A cell's source is analysed once into its `plan`, which every other part asks.
"""

from .closure import AnalysedCell, Closure, State, StoredGroup, closure
from .groups import Grouping, group_variables
from .plan import CellPlan, plan
from .static import CellAnalysis, analyze

__all__ = ["AnalysedCell", "CellAnalysis", "CellPlan", "Closure", "Grouping", "State",
           "StoredGroup", "analyze", "closure", "group_variables", "plan"]

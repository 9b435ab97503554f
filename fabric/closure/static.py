"""What a cell's source reads, writes and imports, from its text alone.

The source is first transformed exactly as IPython will run it (magics, ``!`` lines, ``?``), then
parsed. Reads are over-approximated on purpose: every name loaded anywhere in the cell counts,
nested scopes included, because a missed read breaks the user's cell while an extra one only costs
a little loading. Names hidden in strings that IPython evaluates at run time (magic arguments,
``$var`` expansion in shell lines) count by their identifier tokens. What static analysis cannot
see through (``globals()``, ``eval``, ``%who``...) marks the cell as needing the whole session.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache

from IPython.core.inputtransformer2 import TransformerManager

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DYNAMIC_NAMES = frozenset({"globals", "locals", "vars", "eval", "exec", "dir", "get_ipython"})
_DYNAMIC_MAGICS = frozenset({"who", "whos", "who_ls", "reset", "reset_selective", "xdel", "store",
                             "run", "load", "save", "pickle", "psearch", "pinfo", "pinfo2"})
# Names that, read by session code (functions, methods), let it reach any global by name.
CODE_DYNAMIC = frozenset({"globals", "locals", "vars", "eval", "exec", "user_ns",
                          "user_global_ns"})
_MAGIC_CALLS = frozenset({"run_line_magic", "run_cell_magic", "system", "getoutput"})


@dataclass(frozen=True)
class CellAnalysis:
    source: str  # as IPython will run it
    reads: frozenset[str]
    writes: frozenset[str]
    imports: frozenset[str]  # module names the cell imports
    dynamic: bool  # the cell can reach the whole namespace: its closure is the whole session
    parsed: bool  # False: the source is not valid Python; reads are every identifier in it


_transformer = TransformerManager()


@lru_cache(maxsize=512)
def analyze(source: str) -> CellAnalysis:
    transformed = _transformer.transform_cell(source)
    try:
        tree = ast.parse(transformed)
    except (SyntaxError, ValueError):
        idents = frozenset(_IDENT.findall(source))
        return CellAnalysis(transformed, idents, frozenset(), frozenset(), False, False)
    visitor = _Visitor()
    visitor.visit(tree)
    return CellAnalysis(
        transformed,
        frozenset(visitor.reads),
        frozenset(visitor.writes),
        frozenset(visitor.imports),
        visitor.dynamic,
        True,
    )


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.reads: set[str] = set()
        self.writes: set[str] = set()
        self.imports: set[str] = set()
        self.dynamic = False

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self.writes.add(node.id)
        else:  # Load and Del both need the current value
            self.reads.add(node.id)
            if node.id in _DYNAMIC_NAMES and node.id != "get_ipython":
                self.dynamic = True

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self.reads.add(node.target.id)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.reads.update(node.names)
        self.writes.update(node.names)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.add(alias.name)
            self.writes.add(alias.asname or alias.name.partition(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self.imports.add(node.module)
        for alias in node.names:
            if alias.name == "*":
                self.dynamic = True
            else:
                self.writes.add(alias.asname or alias.name)

    def _define(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.writes.add(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _define

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ("user_ns", "user_global_ns"):
            self.dynamic = True
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _MAGIC_CALLS:
            strings = [a.value for a in node.args if isinstance(a, ast.Constant)
                       and isinstance(a.value, str)]
            if func.attr.startswith("run_") and strings and strings[0] in _DYNAMIC_MAGICS:
                self.dynamic = True
            for text in strings:
                self.reads.update(_IDENT.findall(text))
        self.generic_visit(node)

"""What a cell's source reads, writes, deletes and imports, from its text alone.

The source is first transformed exactly as IPython will run it (magics, ``!`` lines, ``?``), then
parsed, and every name is resolved to its scope as the compiler would: a function's locals, a
comprehension's targets and a class body's closures are not the session's. A global name is a
*read* (the cell needs its session value) unless top-level code surely bound it before that point
of execution (a loop's target inside its body, not after it; an `if` only if both branches bind).
Code that runs later (a function body) is charged to the point that defines it, so the rule stays
an over-approximation: a missed read breaks the user's cell, an extra one only costs loading.

Names hidden in strings that IPython evaluates at run time (magic arguments, ``$var`` expansion
in shell lines) count by their identifier tokens; the bodies of code-running magics (``%%time``,
``%timeit``) are analysed as cells of their own. What static analysis cannot see through
(``globals()``, ``eval``, ``%who``, star imports, ``__main__``) marks the cell as needing the whole
session, and the analysis names the construct that forced it (``eval`` or ``exec`` of a literal
string at top level is analysed as code instead). Source that does not parse (a draft being edited)
is analysed block by block: blocks that parse exactly, the others by every identifier they contain,
and the result is marked inexact.

A cell that loads pickled data (``pickle.load``, ``torch.load``, ``joblib.load``) needs classes and
functions of the session that no source text names: pickle looks them up in ``__main__`` by name.

Reads made only in a *branch* (the body of a top-level ``if`` or ``else``, a ``try``'s handlers and
``else``, a ``match``'s cases) are `maybe` reads: the cell may not take that branch, so what they
alone need can load when the branch is entered (`worker.lazy`). Loops count as taken: their bodies
run in all but degenerate cases, and a check in every iteration would cost the loop.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache

from IPython.core.inputtransformer2 import TransformerManager

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Builtins that reach the whole namespace wherever they are used ...
_DYNAMIC_ANYWHERE = frozenset({"globals", "eval", "exec", "__import__"})
# ... and those that do so only without arguments at module (or class) level.
_DYNAMIC_BARE = frozenset({"locals", "vars", "dir"})
_DYNAMIC_MAGICS = frozenset({"who", "whos", "who_ls", "reset", "reset_selective", "xdel", "store",
                             "run", "load", "save", "pickle", "psearch", "pinfo", "pinfo2",
                             "macro", "recall", "rerun"})
# Magics whose argument (line) or body (cell) is Python code run in the user namespace.
_CODE_MAGICS = frozenset({"time", "timeit", "prun", "capture", "debug"})
# Names that, read by session code (functions, methods), let it reach any global by name.
CODE_DYNAMIC = frozenset({"globals", "locals", "vars", "eval", "exec", "__import__", "user_ns",
                          "user_global_ns", "f_globals", "__main__"})
# Attributes that reach a namespace: IPython's, or a frame's globals.
_NAMESPACE_ATTRS = frozenset({"user_ns", "user_global_ns", "f_globals"})
# Calls that unpickle: what they rebuild names its classes and functions for `__main__` to find.
_UNPICKLING_CALLS = frozenset({"load", "loads", "Unpickler", "read_pickle"})
_MAGIC_CALLS = frozenset({"run_line_magic", "run_cell_magic", "system", "getoutput"})
_BLOCK_CONTINUATION = re.compile(r"(else|elif|except|finally|case)\b|[)\]}]")


@dataclass(frozen=True)
class CellAnalysis:
    source: str  # as IPython will run it
    reads: frozenset[str]  # global names whose value before the cell it may need
    writes: frozenset[str]  # global names it may bind
    deletes: frozenset[str]  # global names it may delete (also reads: `del` needs the value)
    imports: frozenset[str]  # module names the cell imports
    dynamic: bool  # the cell can reach the whole namespace: its closure is the whole session
    parsed: bool  # False: (part of) the source is not valid Python; its reads are a superset
    forced_by: str = ""  # what made it dynamic, as the user wrote it (`globals()`, `import *`)
    unpickles: bool = False  # it loads pickled data, which may name any class of the session
    maybe: frozenset[str] = frozenset()  # reads made only in a branch it may not take
    # reads made only by `del`: the cell needs the name bound, not its value
    only_deleted: frozenset[str] = frozenset()


_transformer = TransformerManager()


@lru_cache(maxsize=1024)
def analyze(source: str) -> CellAnalysis:
    """What `source` needs and binds; cached, as the server and its sessions ask again."""
    return analyze_uncached(source)


def analyze_uncached(source: str) -> CellAnalysis:
    """`analyze` computed afresh, leaving the cache alone: what a cold analysis costs."""
    transformed = _transformer.transform_cell(source)
    visitor = _Visitor()
    try:
        parsed = True
        tree = ast.parse(transformed)
        visitor.block(tree.body)
        found = visitor.result(transformed, parsed)
        if not any(map(branches, tree.body)):  # most cells: no second pass
            return found
        taken = _Visitor()  # the cell with every branch left out: what it reads whatever it takes
        taken.block(_without_branches(s) for s in tree.body)
        return replace(found, maybe=found.reads - taken.result(transformed, parsed).reads)
    except (SyntaxError, ValueError):
        parsed = False
        visitor = _Visitor()
        for block in _blocks(transformed):
            try:
                visitor.block(ast.parse(block).body)
            except (SyntaxError, ValueError):
                visitor.tokens(block)
    return visitor.result(transformed, parsed)


def branches(statement: ast.stmt) -> list[list[ast.stmt]]:
    """The bodies of a top-level statement that run only on some paths."""
    if isinstance(statement, ast.If):
        return [b for b in (statement.body, statement.orelse) if b]
    if isinstance(statement, ast.Try | ast.TryStar):
        return [h.body for h in statement.handlers] + ([statement.orelse] if statement.orelse
                                                       else [])
    if isinstance(statement, ast.Match):
        return [case.body for case in statement.cases]
    return []


def _without_branches(statement: ast.stmt) -> ast.stmt:
    """`statement` with its branches' bodies left out. Their tests, exception types, patterns
    and guards stay: they run before a branch is entered, so what they read cannot wait."""
    if isinstance(statement, ast.If):
        return ast.If(statement.test, [], [])
    if isinstance(statement, ast.Try | ast.TryStar):
        handlers = [ast.ExceptHandler(h.type, None, []) for h in statement.handlers]
        return ast.Try(statement.body, handlers, [], statement.finalbody)
    if isinstance(statement, ast.Match):
        return ast.Match(statement.subject, [ast.match_case(c.pattern, c.guard, [])
                                             for c in statement.cases])
    return statement


def _blocks(source: str) -> list[str]:
    """Top-level blocks: a line at column 0 starts one unless it continues the previous block."""
    blocks: list[list[str]] = []
    for line in source.splitlines():
        starts = line[:1].strip() and not _BLOCK_CONTINUATION.match(line)
        if starts or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    return ["\n".join(b) + "\n" for b in blocks]


class _Scope:
    """One Python scope: what it binds, what it declares, and the names it loads."""

    def __init__(self, kind: str, parent: _Scope | None) -> None:
        self.kind = kind  # module, function, class or comprehension
        self.parent = parent
        self.bound: set[str] = set()
        self.globals: set[str] = set()
        self.nonlocals: set[str] = set()

    @property
    def function_like(self) -> bool:
        return self.kind in ("function", "comprehension")

    def binds_global(self, name: str) -> bool:
        return self.kind == "module" or name in self.globals

    def is_global(self, name: str) -> bool:
        """Whether a use of `name` here reaches the module namespace (the session)."""
        if self.kind == "module" or name in self.globals:
            return True
        if name in self.nonlocals or (self.function_like and name in self.bound):
            return False
        # A class body looks its own names up first, then globals: keep them, conservatively.
        scope = self.parent
        while scope is not None and scope.kind != "module":
            if scope.function_like:
                if name in scope.globals:
                    return True
                if name in scope.bound and name not in scope.nonlocals:
                    return False  # a closure variable of an enclosing function
            scope = scope.parent
        return True


class _Visitor(ast.NodeVisitor):
    """Resolves every name use to its scope, and follows which session names are surely bound.

    `bound` is the set of names that top-level code has unconditionally bound at the current
    point of execution (a frozenset, replaced rather than mutated, so each use keeps a snapshot).
    A use in a nested scope is charged to the point where that scope is defined: anything bound
    by then is still bound when a function body runs later, unless the cell deletes it.
    """

    def __init__(self) -> None:
        self.module = _Scope("module", None)
        self.scope = self.module
        self.bound: frozenset[str] = frozenset()
        self.loads: list[tuple[_Scope, str, frozenset[str]]] = []
        self.binds: list[tuple[_Scope, str]] = []
        self.dels: list[tuple[_Scope, str, frozenset[str]]] = []
        self.reads: set[str] = set()  # found without scopes: magic arguments
        self.imports: set[str] = set()
        self.forced_by = ""  # the first construct that reaches the whole namespace
        self.unpickles = False

    def _whole(self, construct: str) -> None:
        self.forced_by = self.forced_by or construct

    # driving
    def tokens(self, source: str) -> None:
        """Source that does not parse: every identifier is a read at this point."""
        for match in _IDENT.finditer(source):
            self._load(match.group())
            if source[match.start() - 1:match.start()] != ".":  # model.eval( is no eval
                self._mark_builtin(match.group(), bare=True)

    def result(self, source: str, parsed: bool) -> CellAnalysis:
        reads = set(self.reads)
        reads.update(n for s, n, bound in self.loads if n not in bound and s.is_global(n))
        only_deleted = {n for s, n, bound in self.dels
                        if n not in bound and s.binds_global(n)} - reads
        reads |= only_deleted
        deletes = {n for s, n, _ in self.dels if s.binds_global(n)}
        writes = {n for s, n in self.binds if s.binds_global(n)}
        return CellAnalysis(source, frozenset(reads), frozenset(writes), frozenset(deletes),
                            frozenset(self.imports), bool(self.forced_by), parsed, self.forced_by,
                            self.unpickles, only_deleted=frozenset(only_deleted))

    # scopes
    def _enter(self, kind: str, body: Iterable[ast.AST]) -> None:
        outer, self.scope = self.scope, _Scope(kind, self.scope)
        for node in body:
            self.visit(node)
        self.scope = outer

    def _bind(self, name: str, surely: bool = True) -> None:
        scope = self.scope
        if name not in scope.globals and name not in scope.nonlocals:
            scope.bound.add(name)
        self.binds.append((scope, name))
        if surely and scope is self.module:
            self.bound |= {name}

    def _load(self, name: str) -> None:
        self.loads.append((self.scope, name, self.bound))

    def block(self, statements: Iterable[ast.AST]) -> None:
        for statement in statements:
            self.visit(statement)

    # statements, in the order Python evaluates their parts
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        self.block(node.targets)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.annotation)
        if node.value is not None:
            self.visit(node.value)
            self.visit(node.target)
        elif not isinstance(node.target, ast.Name):
            self.visit(node.target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self._load(node.target.id)
            self.visit(node.value)
            self._bind(node.target.id)
        else:
            self.visit(node.target)
            self.visit(node.value)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        before = self.bound
        self.visit(node.target)
        self.block(node.body)
        self.bound = before  # the loop may run zero times
        self.block(node.orelse)
        self.bound = before

    visit_AsyncFor = visit_For

    def visit_While(self, node: ast.While) -> None:
        self.visit(node.test)
        before = self.bound
        self.block(node.body)
        self.bound = before
        self.block(node.orelse)
        self.bound = before

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        before = self.bound
        self.block(node.body)
        taken, self.bound = self.bound, before
        self.block(node.orelse)
        self.bound &= taken

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        self.block(node.items)
        entered = self.bound
        self.block(node.body)
        self.bound = entered  # a context manager may swallow an exception mid-body

    visit_AsyncWith = visit_With

    def visit_Try(self, node: ast.Try | ast.TryStar) -> None:
        before = self.bound
        self.block(node.body)
        self.block(node.orelse)  # runs only when the whole body did
        for handler in node.handlers:
            self.bound = before
            self.visit(handler)
        self.bound = before
        self.block(node.finalbody)

    visit_TryStar = visit_Try

    def visit_Match(self, node: ast.Match) -> None:
        self.visit(node.subject)
        before = self.bound
        for case in node.cases:
            self.bound = before
            self.visit(case)
        self.bound = before  # no case may match

    def visit_Delete(self, node: ast.Delete) -> None:
        self.block(node.targets)

    def _mark_builtin(self, name: str, bare: bool) -> None:
        if name in _DYNAMIC_ANYWHERE or name == "__main__":
            self._whole(name)
        elif bare and name in _DYNAMIC_BARE and not self.scope.function_like:
            self._whole(f"{name}()")  # locals()/vars()/dir() at module level list the session

    # names
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self._bind(node.id)
        elif isinstance(node.ctx, ast.Del):
            self.dels.append((self.scope, node.id, self.bound))
            self._bind(node.id, surely=False)  # `del x` makes x local to a function
            self.bound -= {node.id}
        else:
            self._load(node.id)
            self._mark_builtin(node.id, bare=True)

    def visit_Global(self, node: ast.Global) -> None:
        self.scope.globals.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.scope.nonlocals.update(node.names)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        scope = self.scope  # the target binds in the nearest non-comprehension scope
        while scope.kind == "comprehension" and scope.parent is not None:
            scope = scope.parent
        outer, self.scope = self.scope, scope
        self._bind(node.target.id, surely=False)  # `a or (b := f())` may skip it
        self.scope = outer

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.add(alias.name)
            self._bind(alias.asname or alias.name.partition(".")[0])
            if alias.name == "__main__":
                self._whole("import __main__")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self.imports.add(node.module)
            if node.module == "__main__":
                self._whole("from __main__ import")
        for alias in node.names:
            if alias.name == "*":
                self._whole(f"from {node.module or '.'} import *")  # binds names no one can list
            else:
                self._bind(alias.asname or alias.name)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self._bind(node.name)
        for statement in node.body:
            self.visit(statement)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._bind(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._bind(node.rest)
        self.generic_visit(node)

    # definitions: decorators, defaults, annotations and bases run in the enclosing scope
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        args = node.args
        for default in (*args.defaults, *(d for d in args.kw_defaults if d is not None)):
            self.visit(default)
        every = (*args.posonlyargs, *args.args, *args.kwonlyargs,
                 *(a for a in (args.vararg, args.kwarg) if a is not None))
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                self.visit(decorator)
            for annotation in (*(a.annotation for a in every), node.returns):
                if annotation is not None:
                    self.visit(annotation)
            self._bind(node.name)
        outer, self.scope = self.scope, _Scope("function", self.scope)
        for arg in every:
            self.scope.bound.add(arg.arg)
        for statement in (node.body if isinstance(node.body, list) else [node.body]):
            self.visit(statement)
        self.scope = outer

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
            self.visit(expr)
        self._bind(node.name)
        self._enter("class", node.body)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp
                       | ast.DictComp) -> None:
        first, *rest = node.generators
        self.visit(first.iter)  # evaluated in the enclosing scope
        outer, self.scope = self.scope, _Scope("comprehension", self.scope)
        self.visit(first.target)
        for condition in first.ifs:
            self.visit(condition)
        for generator in rest:
            self.visit(generator)
        elements = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
        for element in elements:
            self.visit(element)
        self.scope = outer

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    # what defeats static analysis
    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in _NAMESPACE_ATTRS:
            self._whole(ast.unparse(node))
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _names_main(node.slice):
            self._whole(ast.unparse(node))  # sys.modules["__main__"]
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in _DYNAMIC_BARE and (node.args or node.keywords):
            self._load(func.id)  # vars(obj), dir(obj): about obj, not the namespace
            for arg in (*node.args, *(k.value for k in node.keywords)):
                self.visit(arg)
            return
        code = _literal_code(node)
        if code is not None and isinstance(func, ast.Name) and self.scope is self.module:
            self._load(func.id)  # code in a literal string, run in the session
            self._inline(code)
            return
        if isinstance(func, ast.Attribute) and func.attr in _MAGIC_CALLS:
            self._magic(func.attr, [a.value for a in node.args
                                    if isinstance(a, ast.Constant) and isinstance(a.value, str)])
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        self.unpickles |= called in _UNPICKLING_CALLS and not _is_json(func)
        if any(_names_main(a) for a in node.args):  # import_module("__main__"), .get("__main__")
            self._whole(f"{ast.unparse(func)}('__main__')")
        self.generic_visit(node)

    def _inline(self, code: str) -> None:
        """Code the cell runs in the session from a string: its needs are the cell's."""
        inner = analyze(code)
        self.reads.update(inner.reads)
        self.imports.update(inner.imports)
        if inner.forced_by:
            self._whole(inner.forced_by)
        self.unpickles |= inner.unpickles
        for written in inner.writes:
            self._bind(written, surely=False)  # the string's own branches are not followed

    def _magic(self, call: str, strings: list[str]) -> None:
        name = strings[0] if call.startswith("run_") and strings else ""
        if name in _DYNAMIC_MAGICS:
            self._whole(f"%{name}")
        code = strings[-1] if name in _CODE_MAGICS and len(strings) >= 2 else None
        if code is not None:
            self._inline(code)
        for text in strings[1:-1] if code is not None else strings:
            self.reads.update(_IDENT.findall(text))  # `%%capture out` options, `!ls $d`


def _names_main(node: ast.AST) -> bool:
    """Whether an expression is `"__main__"` or `__name__` (which is `"__main__"` in a notebook)."""
    return (isinstance(node, ast.Constant) and node.value == "__main__") or \
        (isinstance(node, ast.Name) and node.id == "__name__")


def _literal_code(call: ast.Call) -> str | None:
    """The code of `eval("...")` or `exec("...")` (run in the caller's namespace) when it is a
    literal string; None otherwise."""
    if not (isinstance(call.func, ast.Name) and call.func.id in ("eval", "exec")) \
            or len(call.args) != 1 or call.keywords:
        return None
    arg = call.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def _is_json(func: ast.expr) -> bool:
    """`json.load(...)`: it builds dicts and lists, never a class of the session."""
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
        and func.value.id == "json"

"""Groups a cell may not need, loaded when it enters a branch that needs them.

A worker that runs a cell at once (no draft loaded it ahead) loads before the cell what the cell
reads whatever branch it takes, and keeps pending the groups that only reads in a branch it may
not take need (`closure.Closure.lazy`, with those reads). While groups are pending, every branch
at the cell's top level (`static.branches`) begins with a call naming the identifiers it holds; the
call loads the pending groups that any of them leads to. A name of such a group that the cell has
bound before the branch keeps the cell's value: in a pinned session the branch would have seen that
one. After the cell, whatever is still pending is dropped: the worker never held it, and the
session's version keeps it as it was.
"""

from __future__ import annotations

import ast
import builtins
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from IPython.core.interactiveshell import InteractiveShell

from ..closure.static import branches
from ..errors import LoadFailed
from ..snapshot import codec

NEED = "__llfabric_need__"  # a builtin while groups are pending: no session name can shadow it
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Pending:
    blob: str
    names: tuple[str, ...]
    reads: frozenset[str]  # the cell's reads that lead to it


class _Needs(ast.NodeTransformer):
    """Begins each top-level branch with `NEED((identifiers it holds))`. Identifiers, not only
    names: a magic's argument reads names from inside a string."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        for statement in node.body:
            for body in branches(statement):
                found = sorted(set(_IDENT.findall("\n".join(map(ast.unparse, body)))))
                call = ast.Call(ast.Name(NEED, ast.Load()),
                                [ast.Tuple([ast.Constant(n) for n in found], ast.Load())], [])
                body.insert(0, ast.copy_location(ast.Expr(call), body[0]))
        return ast.fix_missing_locations(node)


class Lazy:
    """The groups pending for the cell about to run, and what loading them cost it."""

    def __init__(self, shell: InteractiveShell,
                 get_objects: Callable[[list[str]], Iterable[codec.Encoded]],
                 loaded: Callable[[tuple[str, ...], str, int], None]) -> None:
        self.shell = shell
        self.get_objects = get_objects  # the blobs' encoded objects, read from the store
        self.loaded = loaded  # told of each group loaded: names, blob, bytes
        self.pending: list[Pending] = []
        self.seconds = 0.0
        self._needs = _Needs()

    def add(self, groups: Iterable[tuple[str, list[str], list[str]]]) -> None:
        self.pending.extend(Pending(blob, tuple(names), frozenset(reads))
                            for blob, names, reads in groups)
        if self.pending and self._needs not in self.shell.ast_transformers:
            self.shell.ast_transformers.append(self._needs)
            setattr(builtins, NEED, self.need)

    def need(self, identifiers: tuple[str, ...]) -> None:
        """Load the pending groups that `identifiers` lead to (a branch is being entered)."""
        due = [p for p in self.pending if not p.reads.isdisjoint(identifiers)]
        if not due:
            return
        start = time.monotonic()
        self.pending = [p for p in self.pending if p not in due]
        ns = self.shell.user_ns
        try:
            objects = self.get_objects([p.blob for p in due])
            for group, encoded in zip(due, objects, strict=True):
                values = codec.loads(encoded, ns)
                for name in group.names:
                    if name not in ns:
                        ns[name] = values[name]
                self.loaded(group.names, group.blob, encoded.nbytes)
        except Exception as exc:
            names = ", ".join(n for p in due for n in p.names)
            raise LoadFailed(f"could not load {names} from the session's state: "
                             f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.seconds += time.monotonic() - start

    def end(self) -> tuple[float, list[str]]:
        """After the cell: the seconds it spent loading, and the names it never needed."""
        unneeded = sorted(n for p in self.pending for n in p.names)
        seconds, self.pending, self.seconds = self.seconds, [], 0.0
        if self._needs in self.shell.ast_transformers:
            self.shell.ast_transformers.remove(self._needs)
        if hasattr(builtins, NEED):
            delattr(builtins, NEED)
        return seconds, unneeded

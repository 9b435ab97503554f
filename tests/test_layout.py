"""The layout holds: fabric's parts import one another in one direction only, and a worker
imports nothing of the server's side."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FABRIC = ROOT / "fabric"
# Modules every part may use: the wire framing, its typed fields, errors, what notices are.
FOUNDATION = {"errors", "protocol", "notices", "typed"}
# What a worker may import of fabric: it runs cells and saves them, nothing more.
WORKER_MAY = {"worker", "snapshot", "closure"} | FOUNDATION


def _part(module: str) -> str:
    """The part of fabric a module belongs to: its package, or the module itself at the top."""
    return module.split(".")[1] if module.count(".") else module


def _imports(path: Path) -> set[str]:
    """The fabric modules `path` imports, resolved to absolute names."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            names = [f"{base}.{a.name}" for a in node.names] if node.module is None else [base]
            found.update(n for n in names if n.startswith("fabric."))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fabric."))
    return found


def _graph() -> dict[str, set[str]]:
    """part -> the other parts it imports, over every module of fabric."""
    graph: dict[str, set[str]] = {}
    for path in FABRIC.rglob("*.py"):
        mine = _part(".".join(path.relative_to(ROOT).with_suffix("").parts))
        theirs = {_part(m) for m in _imports(path)} - {mine, "__init__"}
        graph.setdefault(mine, set()).update(theirs)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph`, as its parts in order, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for other in sorted(graph.get(node, ())):
            if state.get(other) == 1:
                return [*path[path.index(other):], other]
            if other not in state and (found := visit(other, [*path, other])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def test_fabric_parts_import_one_another_without_a_cycle() -> None:
    assert _cycle(_graph()) is None, f"import cycle: {' -> '.join(_cycle(_graph()) or [])}"


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize(("part", "below"), [
    ("session", {"pool", "envs", "snapshot", "closure", "messages"}),
    # a host: its sessions and what they run on; never the server in front of it, or a cluster
    ("host", {"session", "following", "pool", "envs", "snapshot", "closure", "messages",
              "status", "metrics", "config", "auth", "users", "private"}),
    ("pool", {"envs", "snapshot", "closure", "worker"}),
    ("envs", {"worker"}),
    ("snapshot", {"closure"}),
    ("worker", {"snapshot", "closure"}),
    # the simulation is pure (it models the fabric); only the live replay drives a server
    ("fleet", {"client", "config", "embedded", "messages"}),
])
def test_each_part_imports_only_what_lies_below_it(part: str, below: set[str]) -> None:
    assert _graph()[part] - FOUNDATION <= below


def test_closure_and_the_foundation_import_no_other_part() -> None:
    graph = _graph()
    assert graph["closure"] - FOUNDATION == set()
    assert all(graph.get(m, set()) <= FOUNDATION for m in FOUNDATION)


def test_a_worker_imports_nothing_of_the_server_side() -> None:
    """What a zygote loads before it forks workers: the cell loop, its shell, the cold start."""
    probe = ("import sys\nimport fabric.worker.runner, fabric.worker.zygote, fabric.worker.cold,"
             " fabric.worker.dormant\n"
             "print('\\n'.join(m for m in sys.modules if m.startswith('fabric.')))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    assert loaded and {_part(m) for m in loaded} <= WORKER_MAY, loaded

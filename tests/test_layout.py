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
# Modules every part may use: the wire framing, its typed fields, errors, what notices are,
# who owns a background task.
FOUNDATION = {"errors", "protocol", "notices", "typed", "tasks"}
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


def _modules(package: Path, pattern: str = "*.py") -> dict[str, set[str]]:
    """module -> the other modules under `package` it imports, also under TYPE_CHECKING or
    inside a function; a name taken from a package counts as its `__init__`'s. `pattern`
    "**/*.py" takes in the modules of its subpackages too."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package.glob(pattern)}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        imported = {m if m in modules else m.rpartition(".")[0] for m in _imports(path)}
        graph[module] = (imported & modules.keys()) - {module}
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


def test_the_attached_kernel_modules_import_one_another_without_a_cycle() -> None:
    """Within fabric/attach, no import points back up, not even one made only for the type
    checker or inside a function."""
    graph = _modules(FABRIC / "attach")
    assert "fabric.attach.relay" in graph["fabric.attach.attaching"]  # the imports are read
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_fabric_modules_import_one_another_without_a_cycle() -> None:
    """Across all of fabric, module by module, no import points back up, not even one made
    only for the type checker or inside a function."""
    graph = _modules(FABRIC, "**/*.py")
    assert "fabric.cluster.membership" in graph["fabric.cluster.moves"]  # the imports are read
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


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


def test_the_command_line_and_the_server_start_without_the_notebook_format() -> None:
    """nbformat, through jsonschema's format checkers, takes over a second to import: a server's
    start and every command but those that read notebooks would pay it."""
    probe = ("import sys\nimport cli.main, fabric.server, fabric.host.local\n"
             "print(' '.join(m for m in ('nbformat', 'jsonschema') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    assert not loaded, loaded


def _bare_dict(hint: ast.expr) -> bool:
    """Whether a return annotation says only `dict` (or `dict | None`): nothing of what it holds."""
    if isinstance(hint, ast.Constant) and isinstance(hint.value, str):
        hint = ast.parse(hint.value, mode="eval").body
    if isinstance(hint, ast.Name):
        return hint.id in ("dict", "Dict")
    if isinstance(hint, ast.BinOp) and isinstance(hint.op, ast.BitOr):
        sides = (hint.left, hint.right)
        return any(_bare_dict(s) for s in sides) \
            and any(isinstance(s, ast.Constant) and s.value is None for s in sides)
    return False


def _returning_bare_dicts(source: str) -> list[str]:
    """The public functions of a module and of its classes annotated to return a bare dict."""
    found = []

    def visit(body: list[ast.stmt], owner: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{owner}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and not node.name.startswith("_") and node.returns is not None \
                    and _bare_dict(node.returns):
                found.append(f"{owner}{node.name}")

    visit(ast.parse(source).body, "")
    return found


def test_no_public_function_returns_a_bare_dict() -> None:
    """A reply, a status or a figure says what it holds: a dataclass, a TypedDict, or a dict of
    like items (`dict[str, int]`); a map that travels as it is names its alias (`Wire`)."""
    bare = {str(path.relative_to(ROOT)): found for path in sorted(FABRIC.rglob("*.py"))
            if (found := _returning_bare_dicts(path.read_text()))}
    assert bare == {}


def test_the_bare_dict_finder_finds_them() -> None:
    source = ("def a() -> dict: ...\n"
              "def b() -> dict | None: ...\n"
              "def c() -> 'dict': ...\n"
              "class K:\n    async def d(self) -> None | dict: ...\n"
              "    def _e(self) -> dict: ...\n"
              "def f() -> dict[str, int]: ...\n"
              "def g() -> list[dict]: ...\n"
              "def h(): ...\n")
    assert _returning_bare_dicts(source) == ["a", "b", "c", "K.d"]


def test_the_store_names_no_kind_of_tier_but_its_disk() -> None:
    """Tiers plug in: the store is given them in order (`fabric.snapshot.layers`) and treats
    each by its role and the protocols it meets, never by its kind."""
    tree = ast.parse((FABRIC / "snapshot" / "store.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not names & {"MemoryTier", "PeerTier", "RemoteTier"}


def test_the_store_opens_no_socket_of_its_own() -> None:
    """What the store sees of other hosts is a tier; how they are reached (sockets, keys, the
    list of peers) is the cluster's, which gives the peer tier its hosts."""
    for path in (FABRIC / "snapshot").rglob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names} | \
            {(n.module or "").split(".")[0] for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) and not n.level}
        assert not imported & {"zmq", "socket", "ray"}, path


MOST_METHODS = 30  # past this, a class holds more than one job


def test_no_class_in_fabric_holds_more_than_thirty_methods() -> None:
    crowded = {}
    for path in sorted(FABRIC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)
                              for b in node.body)
                if methods > MOST_METHODS:
                    crowded[f"{path.relative_to(ROOT)}:{node.name}"] = methods
    assert crowded == {}

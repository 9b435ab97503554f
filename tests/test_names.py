"""Every class in fabric has a name of its own: a reader who meets `Cell` or `Request` knows
which one it is without looking at the import."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FABRIC = ROOT / "fabric"

# Names defined twice for now, each with why; none may stay here once its copies are one.
PENDING: dict[str, str] = {}


def definitions(root: Path) -> dict[str, list[str]]:
    """class name -> where each class of that name is defined under `root` (path:line)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def twice(root: Path) -> dict[str, list[str]]:
    return {name: places for name, places in definitions(root).items() if len(places) > 1}


def test_no_class_name_in_fabric_is_defined_twice() -> None:
    repeated = twice(FABRIC)
    assert {n: p for n, p in repeated.items() if n not in PENDING} == {}
    assert set(PENDING) <= set(repeated), "defined once now: drop from PENDING " \
        f"{sorted(set(PENDING) - set(repeated))}"


def test_a_name_defined_twice_is_found_nested_or_not(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class Cell:\n    pass\n\n\nclass Only:\n    pass\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("def f():\n    class Cell:\n        pass\n")
    assert twice(tmp_path) == {"Cell": ["a.py:1", "sub/b.py:2"]}

"""The closure of a cell over a hand-built manifest: which groups and aliases it must load."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fabric.closure import Closure
from fabric.closure import closure as closure_of
from fabric.closure.plan import plan
from fabric.snapshot import Group, Manifest

BLOB_A = "a" * 32
BLOB_B = "b" * 32
BLOB_C = "c" * 32
BLOB_D = "d" * 32


def closure(source: str, manifest: Manifest) -> Closure:
    """The closure of `source` on `manifest`, as the server computes it."""
    return closure_of(plan(source), manifest)


def _manifest(**kw: object) -> Manifest:
    groups = (
        Group(BLOB_A, ("x",), 10),
        Group(BLOB_B, ("a", "b"), 20),  # a and b share an object
        Group(BLOB_C, ("f",), 30),
        Group(BLOB_D, ("K",), 40),
    )
    return Manifest(session="s", groups=groups, **kw)  # type: ignore[arg-type]


def test_only_groups_of_read_names_are_included() -> None:
    c = closure("y = x + 1\n", _manifest())
    assert c.names == {"x"}
    assert [g.blob for g in c.groups] == [BLOB_A]
    assert c.imports == {}
    assert not c.whole
    assert c.exact


def test_written_only_names_are_not_loaded() -> None:
    c = closure("x = 5\n", _manifest())
    assert c.groups == ()
    assert c.names == frozenset()


def test_group_mates_come_along() -> None:
    c = closure("print(a)\n", _manifest())
    assert c.names == {"a", "b"}
    assert [g.blob for g in c.groups] == [BLOB_B]


def test_a_group_is_listed_once_even_when_several_of_its_names_are_read() -> None:
    c = closure("print(a, b)\n", _manifest())
    assert [g.blob for g in c.groups] == [BLOB_B]


def test_transitive_ref_brings_the_referenced_group() -> None:
    m = _manifest(refs={"f": ("K",)})
    c = closure("f(3)\n", m)
    assert c.names == {"f", "K"}
    assert {g.blob for g in c.groups} == {BLOB_C, BLOB_D}


def test_refs_chain_transitively() -> None:
    # f reads x; x's code reads a; a's group mate b comes too
    m = _manifest(refs={"f": ("x",), "x": ("a",)})
    c = closure("f()\n", m)
    assert c.names == {"f", "x", "a", "b"}
    assert {g.blob for g in c.groups} == {BLOB_C, BLOB_A, BLOB_B}


def test_refs_of_unread_variables_are_not_followed() -> None:
    m = _manifest(refs={"f": ("K",)})
    c = closure("print(x)\n", m)
    assert c.names == {"x"}


def test_refs_cycles_terminate() -> None:
    m = _manifest(refs={"f": ("K",), "K": ("f",)})
    c = closure("K\n", m)
    assert c.names == {"f", "K"}


def test_module_aliases_go_to_imports_not_groups() -> None:
    m = _manifest(imports={"np": "numpy", "pd": "pandas"})
    c = closure("arr = np.zeros(3)\n", m)
    assert c.imports == {"np": "numpy"}
    assert c.groups == ()
    assert "np" in c.names
    assert c.modules == {"numpy"}  # pandas is the session's, not this cell's


def test_import_closure_holds_the_packages_that_rebuild_the_state() -> None:
    m = _manifest(imports={"np": "numpy"}, packages={"x": ("torch",), "K": ("pandas",)})
    c = closure("import json\nimport pandas.io\ny = x + 1\n", m)
    assert c.modules == {"pandas.io", "torch"}  # the standard library needs no zygote


def test_module_alias_reached_through_a_ref() -> None:
    m = _manifest(imports={"np": "numpy"}, refs={"f": ("np", "K")})
    c = closure("f()\n", m)
    assert c.imports == {"np": "numpy"}
    assert {g.blob for g in c.groups} == {BLOB_C, BLOB_D}


def test_cell_imports_join_the_modules() -> None:
    c = closure("import sklearn.linear_model\nprint(x)\n", _manifest())
    assert "sklearn.linear_model" in c.modules


def test_dynamic_cell_takes_the_whole_session() -> None:
    m = _manifest(imports={"np": "numpy"})
    c = closure("print(globals().keys())\n", m)
    assert c.whole
    assert c.names == {"x", "a", "b", "f", "K", "np"}
    assert {g.blob for g in c.groups} == {BLOB_A, BLOB_B, BLOB_C, BLOB_D}
    assert c.imports == {"np": "numpy"}


def test_names_not_in_the_session_are_ignored() -> None:
    m = _manifest(refs={"f": ("print", "missing")})
    c = closure("f(undefined, len)\n", m)
    assert c.names == {"f"}
    assert [g.blob for g in c.groups] == [BLOB_C]


def test_unparsable_draft_is_inexact_but_still_covers_its_identifiers() -> None:
    c = closure("f(x\n", _manifest())
    assert not c.exact
    assert {"f", "x"} <= c.names




def test_session_code_that_evals_makes_the_closure_the_whole_session() -> None:
    manifest = Manifest(
        session="s",
        groups=(Group("a" * 32, ("show",)), Group("b" * 32, ("df1",)), Group("c" * 32, ("df2",))),
        refs={"show": ("eval", "repr")},
    )
    cl = closure("show('df1')", manifest)
    assert cl.whole and cl.names == {"show", "df1", "df2"}


# Lookups by name: pickle finds classes and functions of __main__ under their own names.

def _by_name_manifest() -> Manifest:
    # what the grouping walk records: instances name their class, classes and functions
    # themselves, methods read globals
    groups = (Group(BLOB_A, ("model",), 10), Group(BLOB_B, ("Model",), 1),
              Group(BLOB_C, ("helper",), 1), Group(BLOB_D, ("data",), 1000))
    refs = {"model": ("Model",), "Model": ("Model", "helper"), "helper": ("helper",)}
    return Manifest(session="s", groups=groups, refs=refs)


def test_saving_an_instance_brings_its_class_and_what_its_methods_read() -> None:
    c = closure("torch.save(model, 'model.pt')\n", _by_name_manifest())
    assert c.names == {"model", "Model", "helper"}
    assert not c.whole


def test_a_cell_that_unpickles_gets_every_class_and_function_of_the_session() -> None:
    c = closure("again = torch.load('model.pt', weights_only=False)\n", _by_name_manifest())
    assert c.names == {"Model", "helper"}  # definitions, not the data
    assert not c.whole


def test_a_whole_closure_names_what_forced_it() -> None:
    m = _manifest(refs={"f": ("globals",)})
    assert closure("print(globals()['x'])\n", m).forced_by == "the cell uses globals"
    c = closure("f()\n", m)
    assert c.whole and c.names == {"x", "a", "b", "f", "K"}
    assert c.forced_by == "the code of 'f' reads globals"
    assert closure("print(x)\n", m).forced_by == ""


def test_a_variable_bound_to_the_main_module_takes_the_whole_session() -> None:
    c = closure("print(getattr(main, name))\n", _manifest(imports={"main": "__main__"}))
    assert c.whole
    assert c.forced_by == "'main' is the __main__ module"


def test_an_import_hook_the_notebook_defined_takes_the_whole_session() -> None:
    # any import, in the cell or in code it calls, may run the hook, which reads globals by name
    c = closure("import json\nprint(x)\n", _manifest(hooks=("sys.meta_path: Finder",)))
    assert c.whole and c.names == {"x", "a", "b", "f", "K"}
    assert c.forced_by == ("an import hook the notebook defined (sys.meta_path: Finder) may "
                           "read any global")


# Closures are pure: any state with the fields of a manifest will do.

@dataclass(frozen=True)
class _Slot:
    blob: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class _State:
    slots: tuple[_Slot, ...]
    imports: dict[str, str] = field(default_factory=dict)
    refs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    packages: dict[str, tuple[str, ...]] = field(default_factory=dict)
    hooks: tuple[str, ...] = ()

    def variables(self) -> dict[str, _Slot]:
        return {name: s for s in self.slots for name in s.names}


def test_a_closure_over_plain_data_gives_back_that_data_s_own_groups() -> None:
    pair, alone = _Slot(BLOB_A, ("a", "b")), _Slot(BLOB_B, ("c",))
    state = _State((pair, alone), imports={"np": "numpy", "os": "os"},
                   packages={"a": ("torch",)})
    c = closure("import json, sklearn\nprint(a, np, os)\n", state)
    assert c.groups == (pair,) and c.groups[0] is pair
    assert c.names == {"a", "b", "np", "os"}
    assert c.modules == {"sklearn", "numpy", "torch"}


def test_closure_analysis_imports_nothing_from_snapshots() -> None:
    probe = ("import json, sys\nimport fabric.closure\n"
             "print(json.dumps([m for m in sys.modules if m.startswith('fabric.')]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2]).stdout
    loaded = json.loads(out)
    assert "fabric.closure" in loaded
    assert not [m for m in loaded if m.startswith(("fabric.snapshot", "fabric.pool"))], loaded


def test_groups_only_a_branch_reads_are_lazy_with_the_reads_that_lead_to_them() -> None:
    m = _manifest(refs={"f": ("K",)})
    c = closure("print(x)\nif x:\n    f(a)\nelse:\n    print(x)\n", m)
    assert {g.blob for g in c.groups} == {BLOB_A, BLOB_B, BLOB_C, BLOB_D}  # drafts load all
    assert {g.blob: reads for g, reads in c.lazy} == {BLOB_B: {"a"}, BLOB_C: {"f"},
                                                       BLOB_D: {"f"}}


def test_a_group_surely_needed_through_code_is_not_lazy() -> None:
    m = _manifest(refs={"f": ("K",)})
    c = closure("f()\nif c:\n    print(K, b)\n", m)
    assert {g.blob: reads for g, reads in c.lazy} == {BLOB_B: {"b"}}


def test_a_whole_session_closure_has_nothing_lazy() -> None:
    c = closure("if c:\n    print(x)\nglobals()\n", _manifest())
    assert c.whole and c.lazy == ()

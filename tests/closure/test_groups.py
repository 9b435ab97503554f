"""Grouping the variables of a live namespace by the objects they share."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from fabric.closure import group_variables


def _groups(namespace: dict, names: list[str] | None = None) -> list[set[str]]:
    names = [n for n in namespace if not n.startswith("__")] if names is None else names
    grouping = group_variables(namespace, names)
    assert not grouping.bounded
    assert sorted(n for g in grouping.groups for n in g) == sorted(names)  # a partition
    return [set(g) for g in grouping.groups]


def _group_of(groups: list[set[str]], name: str) -> set[str]:
    return next(g for g in groups if name in g)


def _notebook(source: str) -> dict:
    """A namespace as a notebook cell would leave it."""
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace


def test_plain_alias_groups_together() -> None:
    a = [1, 2]
    groups = _groups({"a": a, "b": a, "c": [1, 2]})
    assert _group_of(groups, "a") == {"a", "b"}
    assert _group_of(groups, "c") == {"c"}


def test_alias_inside_a_container_groups_together() -> None:
    a = [1, 2]
    groups = _groups({"a": a, "d": {"k": a}, "e": {"k": [1, 2]}})
    assert _group_of(groups, "a") == {"a", "d"}
    assert _group_of(groups, "e") == {"e"}


def test_deep_alias_links_the_outer_containers() -> None:
    inner = {"w": [0.5]}
    groups = _groups({"p": [(1, inner)], "q": {"x": {"y": inner}}})
    assert _group_of(groups, "p") == {"p", "q"}


def test_independent_lists_stay_apart() -> None:
    groups = _groups({"a": [1, 2, 3], "b": [1, 2, 3], "c": []})
    assert groups == [{"a"}, {"b"}, {"c"}]


def test_shared_strings_and_ints_never_link() -> None:
    s = "shared-" + "string"  # one object in both lists
    n = 10**20
    groups = _groups({"a": [s, n, None, True], "b": [s, n, None, True], "c": s, "d": n})
    assert groups == [{"a"}, {"b"}, {"c"}, {"d"}]


def test_shared_library_function_and_module_never_link() -> None:
    groups = _groups({"a": [np.sum, np], "b": {"f": np.sum, "m": np}})
    assert groups == [{"a"}, {"b"}]


def test_numpy_view_groups_with_its_base() -> None:
    arr = np.arange(10)
    groups = _groups({"arr": arr, "v": arr[2:], "other": np.arange(10)})
    assert _group_of(groups, "arr") == {"arr", "v"}
    assert _group_of(groups, "other") == {"other"}


def test_numpy_view_of_a_view_groups_with_its_base() -> None:
    arr = np.zeros((4, 4))
    groups = _groups({"vv": arr[1:][:, 2], "arr": arr})
    assert _group_of(groups, "arr") == {"arr", "vv"}


def test_numpy_copy_stays_apart() -> None:
    arr = np.arange(10)
    groups = _groups({"arr": arr, "c": arr[2:].copy()})
    assert groups == [{"arr"}, {"c"}]


def test_two_views_of_one_array_group_without_the_base() -> None:
    arr = np.arange(10)
    groups = _groups({"v1": arr[:5], "v2": arr[5:]})
    assert groups == [{"v1", "v2"}]


def test_torch_view_groups_with_its_base() -> None:
    t = torch.arange(12.0)
    groups = _groups({"t": t, "view": t.view(3, 4)[1], "other": torch.arange(12.0)})
    assert _group_of(groups, "t") == {"t", "view"}
    assert _group_of(groups, "other") == {"other"}


def test_torch_clone_stays_apart() -> None:
    t = torch.ones(3)
    assert _groups({"t": t, "c": t.clone()}) == [{"t"}, {"c"}]


def test_model_parameter_referenced_elsewhere_groups_with_the_model() -> None:
    model = torch.nn.Linear(3, 2)
    groups = _groups({
        "model": model,
        "w": model.weight,
        "opt_state": {"p": [model.bias.detach()]},  # shares the bias storage
        "lone": torch.nn.Linear(3, 2),
    })
    assert _group_of(groups, "model") == {"model", "w", "opt_state"}
    assert _group_of(groups, "lone") == {"lone"}


def test_notebook_function_refs_are_the_globals_it_reads() -> None:
    ns = _notebook(
        "K = 3\n"
        "OFFSET = 1\n"
        "def f(x):\n"
        "    def inner(y):\n"
        "        return y + OFFSET\n"
        "    return inner(K * x)\n"
    )
    grouping = group_variables(ns, ["K", "OFFSET", "f"])
    assert {"K", "OFFSET"} <= grouping.refs["f"]
    assert grouping.refs["K"] == set()
    # reading a global does not make it share an object with the function
    assert [set(g) for g in grouping.groups] == [{"K"}, {"OFFSET"}, {"f"}]


def test_notebook_function_default_links_with_its_variable() -> None:
    ns = _notebook("cache = {}\ndef f(x, memo=cache):\n    return memo\n")
    groups = _groups(ns, ["cache", "f"])
    assert groups == [{"cache", "f"}]


def test_notebook_closure_cell_links_with_its_variable() -> None:
    ns = _notebook(
        "data = [1]\n"
        "def make(d):\n"
        "    def get():\n"
        "        return d\n"
        "    return get\n"
        "getter = make(data)\n"
    )
    grouping = group_variables(ns, ["data", "getter"])
    assert [set(g) for g in grouping.groups] == [{"data", "getter"}]


def test_notebook_functions_do_not_link_through_their_shared_globals() -> None:
    ns = _notebook("def f():\n    return g()\ndef g():\n    return 1\n")
    grouping = group_variables(ns, ["f", "g"])
    assert [set(g) for g in grouping.groups] == [{"f"}, {"g"}]
    assert "g" in grouping.refs["f"]


def test_notebook_class_gives_refs_through_its_methods() -> None:
    ns = _notebook(
        "SCALE = 2\n"
        "def helper(v):\n"
        "    return v\n"
        "class C:\n"
        "    def m(self):\n"
        "        return helper(SCALE)\n"
        "    @staticmethod\n"
        "    def s():\n"
        "        return STATIC_G\n"
        "    @property\n"
        "    def p(self):\n"
        "        return PROP_G\n"
        "obj = C()\n"
    )
    grouping = group_variables(ns, ["SCALE", "helper", "C", "obj"])
    assert {"helper", "SCALE", "STATIC_G", "PROP_G"} <= grouping.refs["C"]
    assert {"helper", "SCALE"} <= grouping.refs["obj"]  # through its class


# Names that pickle, copy, torch.save and multiprocessing look up in __main__.

def test_an_instance_refers_to_its_notebook_class_by_name() -> None:
    ns = _notebook(
        "import functools\n"
        "class Model:\n"
        "    class Head:\n"
        "        pass\n"
        "def act(v):\n"
        "    return v\n"
        "model = Model()\n"
        "head = Model.Head()\n"
        "nested = {'layers': [(1, Model())]}\n"
        "later = functools.partial(act, 2)\n"
        "plain = [1, 2]\n"
    )
    names = ["later", "Model", "act", "model", "head", "nested", "plain"]
    refs = group_variables(ns, names).refs
    for name in ("model", "head", "nested"):
        assert "Model" in refs[name], name  # pickled as __main__.Model, __main__.Model.Head
    assert "act" in refs["later"]  # the partial's function, pickled as __main__.act
    assert refs["plain"] == set()
    # classes and functions are looked up by their own name: what unpickling may need
    assert "Model" in refs["Model"]
    assert "act" in refs["act"]


def test_a_method_held_elsewhere_refers_to_its_class_and_groups_with_it() -> None:
    ns = _notebook(
        "class Ops:\n"
        "    @staticmethod\n"
        "    def square(v):\n"
        "        return v * v\n"
        "jobs = [Ops.square]\n"
        "other = Ops()\n"
    )
    grouping = group_variables(ns, ["jobs", "Ops", "other"])
    assert "Ops" in grouping.refs["jobs"]  # pickled as __main__.Ops.square
    # one function object: loaded apart, jobs[0] would not be Ops.square
    assert _group_of([set(g) for g in grouping.groups], "jobs") == {"jobs", "Ops"}
    # an instance does not share its class's methods: instances stay apart from their class
    assert _group_of([set(g) for g in grouping.groups], "other") == {"other"}


def test_local_classes_give_no_name() -> None:
    ns = _notebook("def make():\n    class Local:\n        pass\n    return Local()\n"
                   "obj = make()\n")
    assert group_variables(ns, ["make", "obj"]).refs["obj"] == set()


def test_object_arrays_are_walked_through_their_elements() -> None:
    ns = _notebook("class Cell:\n    pass\nshared = [0]\n")
    ns["cells"] = np.array([ns["Cell"](), ns["shared"], "text"], dtype=object)
    ns["frame"] = pd.DataFrame({"c": [ns["Cell"](), ns["Cell"]()]})
    grouping = group_variables(ns, ["shared", "cells", "frame"])
    assert "Cell" in grouping.refs["cells"]
    assert "Cell" in grouping.refs["frame"]
    assert _group_of([set(g) for g in grouping.groups], "cells") == {"cells", "shared"}


def test_library_function_gives_no_refs() -> None:
    grouping = group_variables({"f": np.linalg.norm}, ["f"])
    assert grouping.refs["f"] == set()


def test_tiny_budget_puts_every_name_in_one_group() -> None:
    ns = {"a": [1, [2, [3]]], "b": {"x": [4]}, "c": [5]}
    grouping = group_variables(ns, ["a", "b", "c"], budget=2)
    assert grouping.bounded
    assert len(grouping.groups) == 1
    assert sorted(grouping.groups[0]) == ["a", "b", "c"]


def test_ample_budget_is_not_bounded() -> None:
    ns = {"a": [1, [2, [3]]], "b": {"x": [4]}}
    grouping = group_variables(ns, ["a", "b"], budget=100)
    assert not grouping.bounded
    assert len(grouping.groups) == 2


def test_large_flat_list_of_floats_is_cheap() -> None:
    # floats are atoms: a million of them cost one visit, not a million
    ns = {"big": [float(i) for i in range(1_000_000)]}
    grouping = group_variables(ns, ["big"], budget=10)
    assert not grouping.bounded


def test_torch_from_numpy_groups_with_its_array() -> None:
    arr = np.ones(4)
    ns = {"arr": arr, "t": torch.from_numpy(arr), "other": np.ones(4)}
    groups = {frozenset(g) for g in group_variables(ns, ["arr", "t", "other"]).groups}
    assert groups == {frozenset({"arr", "t"}), frozenset({"other"})}


def test_refs_are_global_loads_not_attribute_names() -> None:
    ns = _notebook("def f(self):\n    return self.model(data) + math.pi\n")
    refs = group_variables(ns, ["f"]).refs["f"]
    assert {"data", "math"} <= refs
    assert not {"model", "pi"} & refs  # attributes: a session `model` is not needed


def test_function_reading_the_namespace_by_name_is_marked() -> None:
    ns = _notebook("def f():\n    return get_ipython().user_ns['x']\n"
                   "def g(n):\n    return getattr(sys.modules['__main__'], n)\n"
                   "def h():\n    return sys._getframe().f_globals\n")
    refs = group_variables(ns, ["f", "g", "h"]).refs
    assert "user_ns" in refs["f"]
    assert "__main__" in refs["g"]
    assert "f_globals" in refs["h"]


def test_sizes_count_buffers_once_per_group() -> None:
    arr = np.zeros(1_000_000)  # 8 MB
    ns = {"arr": arr, "view": arr[10:], "small": [1, 2]}
    grouping = group_variables(ns, ["arr", "view", "small"])
    assert 8_000_000 <= grouping.sizes["arr"] + grouping.sizes["view"] < 8_100_000
    assert grouping.sizes["small"] < 1000


def test_a_container_listed_many_times_counts_once() -> None:
    row = {"a": [1]}
    rows = [row] * 1000
    grouping = group_variables({"rows": rows, "other": [row]}, ["rows", "other"], budget=10)
    assert not grouping.bounded  # the list, the dict and its list: three objects, not 2001
    assert grouping.groups == [["rows", "other"]]
    assert grouping.sizes["rows"] == rows.__sizeof__() + row.__sizeof__() + row["a"].__sizeof__()


def test_a_batch_partly_reached_before_walks_only_the_new_containers() -> None:
    first = [{"i": i} for i in range(100)]
    mixed = [first[0], {"new": [1, 2]}, first[1]]
    grouping = group_variables({"first": first, "mixed": mixed}, ["first", "mixed"])
    assert grouping.groups == [["first", "mixed"]]
    assert grouping.sizes["mixed"] == mixed.__sizeof__() + mixed[1].__sizeof__() + \
        mixed[1]["new"].__sizeof__()


def test_tensor_size_is_its_storage() -> None:
    t = torch.zeros(1000, 250)  # 1 MB of float32
    grouping = group_variables({"t": t, "col": t[:, 0]}, ["t", "col"])
    assert 1_000_000 <= grouping.sizes["t"] + grouping.sizes["col"] < 1_010_000


def test_packages_come_from_types_and_library_functions() -> None:
    ns = _notebook("import torch.nn as nn\nclass Net(nn.Module):\n    pass\nnet = Net()\n")
    ns |= {"arr": np.ones(2), "fn": np.linalg.norm, "plain": [1, {"a": 2.0}]}
    grouping = group_variables(ns, ["net", "arr", "fn", "plain", "Net"])
    assert "torch" in grouping.packages["net"]
    assert "torch" in grouping.packages["Net"]  # a notebook class with a library base
    assert grouping.packages["arr"] == {"numpy"}
    assert grouping.packages["fn"] == {"numpy"}
    assert grouping.packages["plain"] == set()  # builtins and the standard library are free


def test_bounded_grouping_keeps_every_name_as_a_ref() -> None:
    ns = {"a": [[1]], "b": [[2]]}
    grouping = group_variables(ns, ["a", "b"], budget=1)
    assert grouping.bounded
    assert grouping.refs["a"] == {"a", "b"}


def test_a_mock_is_grouped_without_running_its_code() -> None:
    """A mock makes a new child on every attribute or magic method it is asked for: the walk must
    ask none, or it follows each new child into the next until memory runs out."""
    from unittest.mock import MagicMock

    mock = MagicMock()
    mock.fit.return_value = [1, 2]
    mock.fit()
    children = dict(mock._mock_children)
    grouping = group_variables({"mock": mock, "other": [mock]}, ["mock", "other"], budget=5_000)
    assert not grouping.bounded and grouping.groups == [["mock", "other"]]
    assert mock._mock_children == children


def test_an_opaque_variable_is_not_walked_but_linked_by_whoever_reaches_it() -> None:
    records = [{"id": 1}]
    ns = {"records": records, "holder": [records], "other": [records[0]], "apart": [2]}
    grouping = group_variables(ns, list(ns), opaque={"records", "apart"})
    groups = [set(g) for g in grouping.groups]
    # `other` reaches into `records` unseen: what `snapshot.plain` proves never happens
    assert groups == [{"records", "holder"}, {"other"}, {"apart"}]
    assert grouping.refs["records"] == grouping.packages["records"] == set()

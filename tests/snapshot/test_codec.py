"""The codec: a group of variables to bytes and back, into a (new) namespace."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from fabric.snapshot import dumps, loads


def _notebook(source: str) -> dict:
    namespace: dict = {"__name__": "__main__"}
    # dont_inherit: this module's `from __future__ import annotations` must not leak in
    exec(compile(source, "<cell>", "exec", dont_inherit=True), namespace)
    return namespace


def _round_trip(names: list[str], source: str, new_ns: dict | None = None) -> tuple[dict, dict]:
    """Run `source` as a notebook, save `names`, load them into a fresh namespace."""
    old = _notebook(source)
    blob = dumps({n: old[n] for n in names}, old)
    new = {"__name__": "__main__"} if new_ns is None else new_ns
    values = loads(blob, new)
    new.update(values)
    return old, new


def test_plain_values_round_trip() -> None:
    values = {"a": [1, 2.5, "x", None], "b": {"k": (1, 2)}, "c": b"bytes"}
    assert loads(dumps(values, {}), {}) == values


def test_aliasing_inside_a_group_survives() -> None:
    shared = [1, 2]
    data = loads(dumps({"a": shared, "b": shared, "d": {"k": shared}}, {}), {})
    assert data["a"] is data["b"]
    assert data["d"]["k"] is data["a"]
    data["a"].append(3)
    assert data["d"]["k"] == [1, 2, 3]


def test_notebook_function_reads_the_loading_namespace() -> None:
    old, new = _round_trip(["f"], "K = 2\ndef f(x):\n    return K * x\n", {"__name__": "__main__",
                                                                           "K": 10})
    assert new["f"].__globals__ is new
    assert new["f"](3) == 30  # the loading session's K, not the saved one
    new["K"] = 100
    assert new["f"](3) == 300
    assert old["f"](3) == 6


def test_notebook_function_does_not_drag_its_globals_into_the_blob() -> None:
    ns = _notebook("BIG = list(range(100000))\ndef f():\n    return len(BIG)\n")
    blob = dumps({"f": ns["f"]}, ns)
    assert len(blob) < 10_000
    target = {"__name__": "__main__", "BIG": [1, 2]}
    assert loads(blob, target)["f"]() == 2


def test_function_attributes_survive() -> None:
    source = (
        "def f(a, b=[1], *, c=3) -> int:\n"
        "    '''doc'''\n"
        "    return a + b[0] + c\n"
        "f.tag = 'marked'\n"
    )
    _, new = _round_trip(["f"], source)
    f = new["f"]
    assert f(1) == 5
    assert f(1, [10], c=0) == 11
    assert f.__doc__ == "doc"
    assert f.tag == "marked"
    assert f.__defaults__ == ([1],)
    assert f.__kwdefaults__ == {"c": 3}
    assert f.__annotations__ == {"return": int}


def test_closure_with_free_variables_works() -> None:
    source = (
        "def make_adder(n):\n"
        "    def add(x):\n"
        "        return x + n + OFFSET\n"
        "    return add\n"
        "OFFSET = 0\n"
        "add5 = make_adder(5)\n"
    )
    _, new = _round_trip(["add5"], source, {"__name__": "__main__", "OFFSET": 1000})
    assert new["add5"](1) == 1006


def test_recursive_closure_works() -> None:
    source = (
        "def make():\n"
        "    def fact(n):\n"
        "        return 1 if n <= 1 else n * fact(n - 1)\n"
        "    return fact\n"
        "fact = make()\n"
    )
    _, new = _round_trip(["fact"], source)
    assert new["fact"](5) == 120
    assert new["fact"].__closure__[0].cell_contents is new["fact"]


def test_closure_cell_without_a_value_stays_empty() -> None:
    source = (
        "def outer():\n"
        "    def early():\n"
        "        return late\n"
        "    f = early\n"
        "    return f\n"
        "    late = 1\n"  # never reached: early's cell stays empty
        "early = outer()\n"
    )
    _, new = _round_trip(["early"], source)
    with pytest.raises(NameError):
        new["early"]()


def test_closure_sharing_a_mutable_cell_with_a_variable() -> None:
    source = (
        "def counter(store):\n"
        "    def inc():\n"
        "        store.append(1)\n"
        "        return len(store)\n"
        "    return inc\n"
        "hits = []\n"
        "inc = counter(hits)\n"
    )
    _, new = _round_trip(["hits", "inc"], source)
    new["inc"]()
    new["inc"]()
    assert new["hits"] == [1, 1]


def test_lambda_round_trips_and_reads_the_new_namespace() -> None:
    _, new = _round_trip(["g"], "S = 1\ng = lambda x: x * S\n", {"__name__": "__main__", "S": 7})
    assert new["g"](2) == 14
    assert new["g"].__name__ == "<lambda>"


def test_notebook_class_and_instance_in_one_group_keep_identity() -> None:
    source = (
        "class Point:\n"
        "    def __init__(self, x):\n"
        "        self.x = x\n"
        "    def scaled(self):\n"
        "        return self.x * FACTOR\n"
        "FACTOR = 2\n"
        "p = Point(3)\n"
    )
    _, new = _round_trip(["Point", "p"], source, {"__name__": "__main__", "FACTOR": 5})
    assert type(new["p"]) is new["Point"]
    assert isinstance(new["p"], new["Point"])
    assert new["p"].scaled() == 15  # the method is bound to the loading namespace
    assert new["Point"](4).x == 4


def test_instance_with_methods_referencing_other_functions() -> None:
    source = (
        "def helper(v):\n"
        "    return v + 1\n"
        "class C:\n"
        "    def m(self):\n"
        "        return helper(1)\n"
        "obj = C()\n"
    )
    target = {"__name__": "__main__", "helper": lambda v: v * 100}
    _, new = _round_trip(["obj"], source, target)
    assert new["obj"].m() == 100


def test_numpy_arrays_equal_after_round_trip() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    data = loads(dumps({"arr": arr, "view": arr[1:]}, {}), {})
    np.testing.assert_array_equal(data["arr"], arr)
    assert data["arr"].dtype == np.float32
    np.testing.assert_array_equal(data["view"], arr[1:])


def test_torch_tensors_equal_after_round_trip() -> None:
    t = torch.randn(4, 5)
    model = torch.nn.Linear(5, 2)
    data = loads(dumps({"t": t, "model": model, "w": model.weight}, {}), {})
    assert torch.equal(data["t"], t)
    assert torch.equal(data["model"].weight, model.weight)
    assert data["w"] is data["model"].weight  # the parameter alias survives in one group
    x = torch.randn(1, 5)
    assert torch.equal(data["model"](x), model(x))


def test_numpy_view_shares_memory_after_round_trip() -> None:
    arr = np.zeros(6)
    data = loads(dumps({"arr": arr, "v": arr[2:]}, {}), {})
    data["v"][0] = 7.0
    assert data["arr"][2] == 7.0


def test_torch_view_shares_storage_after_round_trip() -> None:
    t = torch.zeros(6)
    data = loads(dumps({"t": t, "v": t[2:]}, {}), {})
    data["v"][0] = 7.0
    assert data["t"][2].item() == 7.0


def test_parameter_keeps_grad_and_shares_storage_with_views_of_its_data() -> None:
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.full((3,), 2.0)
    data = loads(dumps({"p": param, "tail": param.data[1:]}, {}), {})
    assert isinstance(data["p"], torch.nn.Parameter) and data["p"].requires_grad
    assert torch.equal(data["p"].grad, torch.full((3,), 2.0))
    data["tail"][0] = 5.0
    assert data["p"][1].item() == 5.0


def test_bfloat16_and_non_contiguous_tensors_round_trip() -> None:
    t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4).t()
    data = loads(dumps({"t": t}, {}), {})
    assert data["t"].dtype == torch.bfloat16 and torch.equal(data["t"], t)
    assert data["t"].stride() == t.stride()


def test_non_dict_pickle_is_rejected() -> None:
    with pytest.raises(pickle.UnpicklingError):
        loads(pickle.dumps([1, 2, 3]), {})


def test_notebook_function_outside_loads_is_rejected() -> None:
    ns = _notebook("def f():\n    return 1\n")
    blob = dumps({"f": ns["f"]}, ns)
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(blob.stream)


def test_loads_restores_state_after_a_failure() -> None:
    ns = _notebook("def f():\n    return X\n")
    good = dumps({"f": ns["f"]}, ns)
    with pytest.raises(pickle.UnpicklingError):
        loads(pickle.dumps("not a dict"), {})
    target = {"__name__": "__main__", "X": 9}
    assert loads(good, target)["f"]() == 9


def test_lru_cached_notebook_methods_come_back_by_value() -> None:
    ns = _notebook("from functools import lru_cache\n"
                   "class Tok:\n    @lru_cache(maxsize=8)\n"
                   "    def ident(self, x):\n        return x\n"
                   "t = Tok()\n")
    data = loads(dumps({"t": ns["t"]}, ns), {"__name__": "__main__"})
    assert data["t"].ident(3) == 3
    assert data["t"].ident.cache_parameters()["maxsize"] == 8


def test_tensors_in_an_autograd_graph_are_refused() -> None:
    weight = torch.ones(3, requires_grad=True)
    loss = (weight * 2).sum()
    with pytest.raises(pickle.PicklingError, match="autograd graph"):
        dumps({"loss": loss}, {})
    data = loads(dumps({"weight": weight, "detached": loss.detach()}, {}), {})
    assert data["weight"].requires_grad and data["detached"].item() == 6.0


@pytest.mark.parametrize("mode", ["r", "w+", "rb", "a"])
def test_an_open_file_is_refused_not_copied(tmp_path, mode: str) -> None:
    # a readable text file would otherwise come back as a StringIO of its contents
    path = tmp_path / "data.txt"
    path.write_text("line 0\n")
    with open(path, mode) as file, pytest.raises(pickle.PicklingError, match="open file"):
        dumps({"f": file}, {})


def test_a_closed_file_comes_back_closed_with_its_name(tmp_path) -> None:
    path = tmp_path / "data.txt"
    with open(path, "w") as file:
        file.write("x")
    back = loads(dumps({"f": file}, {}), {})["f"]
    assert back.closed and back.name == str(path) and back.mode == "w"

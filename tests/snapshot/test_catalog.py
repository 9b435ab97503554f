"""A version's catalog: what it says of each name, how it is bounded and merged commit after
commit, and how it answers completion and inspection with no worker."""

from __future__ import annotations

import dataclasses
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from fabric.closure.plan import plan
from fabric.errors import StoreError
from fabric.snapshot import Store, catalog, dumps, history
from fabric.snapshot.commit import CellRecord, Report, commit
from fabric.worker.deadline import limit


class Thing:
    """A thing."""

    def method_one(self, a, b=2):
        """Add b to a.

        More words that the catalog leaves out."""
        return a + b

    @property
    def boom(self) -> int:
        raise RuntimeError("a property is never run")


NS = {"thing": Thing(), "Thing": Thing, "my_unique_var": {"alpha": 1}, "np": np,
      "data": np.zeros((3, 4), dtype="float32"), "f": len}


def test_each_name_is_described_as_completion_and_shift_tab_need() -> None:
    described = catalog.describe(NS, [*NS, "gone"])
    entries, classes = described["names"], described["classes"]
    assert set(entries) == set(NS)
    thing = entries["thing"]
    assert (thing["type"], thing["kind"], thing["class"]) == ("Thing", "instance",
                                                              f"{__name__}.Thing")
    cls = classes[thing["class"]]  # what all its instances share, described once
    assert cls["doc"] == "A thing." and cls["attrs"][:2] == ["boom", "method_one"]
    assert cls["members"]["method_one"] == {"kind": "function", "type": "function",
                                            "signature": "(a, b=2)", "doc": "Add b to a."}
    assert (entries["data"]["shape"], entries["data"]["dtype"]) == ([3, 4], "float32")
    assert "repr" not in entries["data"]  # an array is never printed for its catalog
    assert entries["my_unique_var"]["repr"] == "{'alpha': 1}"
    assert entries["np"]["kind"] == "module" and "zeros" in entries["np"]["attrs"]
    assert entries["Thing"]["signature"] == "()" and entries["f"]["kind"] == "function"


def test_a_catalog_stays_bounded() -> None:
    described = catalog.describe({"big": list(range(10**6))}, ["big"])
    assert len(described["names"]["big"]["repr"]) <= catalog.MAX_TEXT
    arrays = catalog.describe({f"a{i}": np.zeros(i) for i in range(500)},
                              [f"a{i}" for i in range(500)])
    assert list(arrays["classes"]) == ["numpy.ndarray"]  # one class for 500 arrays
    module = catalog.describe(NS, ["np"])["names"]["np"]
    many = {"names": {f"v{i}": module for i in range(300)}, "classes": {}}
    merged = catalog.merge(catalog.EMPTY, many, set(many["names"]))
    assert len(catalog.encode(merged)) <= catalog.MAX_BYTES + 64 * 1024
    assert set(merged["names"]) == set(many["names"])
    assert all(e["attrs"] for e in merged["names"].values())


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_a_large_bytes_value_is_described_without_printing_it_whole(kind: type) -> None:
    big = kind(50 << 20)
    tracemalloc.start()
    try:
        entry = catalog.describe({"big": big}, ["big"])["names"]["big"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(entry["repr"]) <= catalog.MAX_TEXT and entry["len"] == 50 << 20
    assert peak < 16 << 20  # its repr whole would be 200 MB


def test_merge_keeps_the_parents_entries_of_names_still_there() -> None:
    parent = catalog.describe(NS, ["thing", "f"])
    fresh = catalog.describe({"f": 3}, ["f"])
    merged = catalog.merge(parent, fresh, {"f", "x"})
    assert set(merged["names"]) == {"f"} and merged["names"]["f"]["type"] == "int"
    assert list(merged["classes"]) == ["builtins.int"]  # Thing's went with thing


@pytest.mark.parametrize("data", [b"", b"\x93\x01\x02\x03", catalog.encode(catalog.EMPTY)[:-1],
                                  b"\x82\xa6format\x01\xa5names\x91\x01",
                                  catalog.encode({"names": {"x": {}}, "classes": []})])
def test_a_damaged_catalog_is_a_store_error(data: bytes) -> None:
    with pytest.raises(StoreError, match="catalog"):
        catalog.decode(data)


@pytest.mark.parametrize(("code", "matches", "start"), [
    ("my_uni", ["my_unique_var"], 0), ("x = my_uni", ["my_unique_var"], 4),
    ("thing.meth", ["method_one"], 6), ("np.zer", ["zeros", "zeros_like"], 3),
    ("pri", ["print"], 0), ("3.", [], 2), ("no_such", [], 0), ("thing.nope", [], 6),
    ("my_unique_var['al", [], 15), ('print("al', [], 7),
])
def test_completion_from_the_catalog(code: str, matches: list[str], start: int) -> None:
    reply = catalog.complete(catalog.describe(NS, list(NS)), code, len(code))
    assert (reply["matches"], reply["cursor_start"], reply["cursor_end"]) == (
        matches, start, len(code))


def test_private_names_only_once_their_underscore_is_typed() -> None:
    entries = catalog.describe(NS, list(NS))
    assert "__class__" not in catalog.complete(entries, "thing.", 6)["matches"]
    assert "__class__" in catalog.complete(entries, "thing.__", 8)["matches"]


@pytest.mark.parametrize(("code", "cursor", "shown"), [
    ("thing", 5, "A thing."), ("thing.method_one(", 17, "Add b to a."),
    ("f(thing.method_one(1, ", 22, "(a, b=2)"), ("data", 2, "(3, 4)"),
])
def test_inspection_from_the_catalog(code: str, cursor: int, shown: str) -> None:
    reply = catalog.inspect(catalog.describe(NS, list(NS)), code, cursor)
    assert reply["found"] and shown in reply["data"]["text/plain"]


def test_a_commit_merges_the_catalog_that_gc_keeps(tmp_path: Path) -> None:
    store = Store(tmp_path)

    def report(owned: list[str], **values: object) -> Report:
        groups = [(store.put_object(dumps({k: v}, {})), [k], 1) for k, v in values.items()]
        return Report(groups=groups, kept=[], imports={}, refs={}, packages={},
                      ambient=store.put(b"ambient"), owned=owned, unsaved={},
                      described=catalog.describe(values, list(values)))

    def cell(source: str, count: int) -> CellRecord:
        return CellRecord(source, count, "ok", 0.1, plan(source).modules)

    first, m1 = commit(store, "s", None, report(["x", "y"], x=1, y="two"), cell("x, y", 1))
    kept = dataclasses.replace(report(["x", "y"], x=1.5), kept=[])  # y deleted, x rebound
    _, m2 = commit(store, "s", first, dataclasses.replace(kept, owned=["x"]), cell("x", 2))
    assert m2.catalog and m2.catalog != m1.catalog
    entries = catalog.decode(store.get(m2.catalog))["names"]
    assert entries["x"]["type"] == "float" and entries["y"]["type"] == "str"  # y kept as it was
    history.gc(store, grace=0)
    assert store.has(m2.catalog)
    assert history.cells(store, "s") == [(1, "x, y"), (2, "x")]


class Endless:
    """Every hook a describer might call never returns, and `shape` counts its reads."""

    reads = 0
    dtype = "float32"

    def __dir__(self):
        while True:
            pass

    def __getattr__(self, name):
        while True:
            pass

    def __len__(self):
        while True:
            pass

    @property
    def shape(self):
        Endless.reads += 1
        return (1,)


def test_attributes_are_read_from_the_dicts_and_no_users_property_runs() -> None:
    import pandas as pd
    import torch

    value = Endless()
    value.size = 3
    ns = {"e": value, "a": np.zeros((2, 3), np.int8), "t": torch.ones(4),
          "df": pd.DataFrame({"alpha": [1]})}
    found = catalog.describe(ns, list(ns))
    entry = catalog._entry(found, "e")
    assert {"size", "dtype", "shape"} <= set(entry["attrs"]) and "shape" not in entry
    assert Endless.reads == 0
    assert (found["names"]["a"]["shape"], found["names"]["a"]["dtype"]) == ([2, 3], "int8")
    assert (found["names"]["t"]["shape"], found["names"]["t"]["dtype"]) == ([4], "torch.float32")
    assert "alpha" in catalog._entry(found, "df")["attrs"]  # a known library's `__dir__` runs


class _SlowRepr:
    def __repr__(self) -> str:
        end = time.monotonic() + 0.001
        while time.monotonic() < end:
            pass
        return "slow"


def test_describing_under_a_limit_that_ticks_as_each_repr_ends_never_fails() -> None:
    # a value's code that ends about when its limit ticks: the tick lands in its repr, in the
    # catalog's own code around it, or on the limit's way out; none may leave `describe`
    namespace = {f"v{i}": _SlowRepr() for i in range(500)}
    for _ in range(3):
        described = catalog.describe(namespace, list(namespace), lambda: limit(0.001))
        assert set(described["names"]) == set(namespace)
        assert {e.get("repr", "slow") for e in described["names"].values()} == {"slow"}

"""Committing a version from a worker's save report: what it folds in, and what it refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fabric.closure.plan import plan
from fabric.errors import ProtocolError, StaleHead, StoreError
from fabric.snapshot import Manifest, Store, dumps
from fabric.snapshot.commit import CellRecord, Report, commit
from fabric.worker.messages import FROM_WORKER, Done, decode


def _report(store: Store, owned: list[str], **values: object) -> Report:
    """What a worker sends after a cell that left `values` (each its own group)."""
    groups = [(store.put_object(dumps({k: v}, {})), [k], 1) for k, v in values.items()]
    return Report(groups=groups, kept=[], imports={}, refs={}, packages={},
                  ambient=store.put(b"ambient"), owned=owned, unsaved={})


def _cell(source: str, count: int) -> CellRecord:
    return CellRecord(source, count, "ok", 0.5, plan(source).modules)


def test_a_report_folds_into_the_next_version(tmp_path: Path) -> None:
    store = Store(tmp_path)
    first, m1 = commit(store, "s", None, _report(store, ["x", "y"], x=1, y=2),
                       _cell("import numpy, json\nx, y = 1, 2\n", 1))
    report = dataclasses.replace(_report(store, ["x", "y"], y=3), kept=["x"])  # x's group stays
    second, m2 = commit(store, "s", first, report, _cell("import pandas\ny = 3\n", 2))
    assert store.head("s") == second and Manifest.decode(store.get_manifest(second)) == m2
    assert (m1.version, m2.version, m2.parent) == (1, 2, first)
    assert {n: g.blob for g in m2.groups for n in g.names} == {
        "x": m1.variables()["x"].blob, "y": report.groups[0][0]}
    assert m2.modules == ("numpy", "pandas")  # every cell's packages, not the standard library
    assert m2.cell["source"] == "import pandas\ny = 3\n" and m2.cell["execution_count"] == 2


def test_a_cell_that_leaves_the_same_groups_in_another_order_makes_no_version(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    first, _ = commit(store, "s", None, _report(store, ["x", "z"], x=1, z=2),
                      _cell("x, z = 1, 2\n", 1))
    again = _report(store, ["x", "z"], z=2, x=1)  # a worker that loaded them the other way
    head, manifest = commit(store, "s", first, again, _cell("print(x, z)\n", 2))
    assert head == first == store.head("s") and manifest.version == 1


@pytest.mark.parametrize("spoil", [
    lambda r: r.pop("owned"),
    lambda r: r.update(groups=[["b" * 32, "y", "many"]]),
    lambda r: r.update(refs={"y": 5}),
])
def test_a_malformed_report_is_refused_on_receipt(tmp_path: Path, spoil) -> None:
    wire = Done("ok", saved=_report(Store(tmp_path), ["y"], y=3)).to_wire()
    spoil(wire["saved"])
    with pytest.raises(ProtocolError, match="saved"):
        decode(wire, FROM_WORKER)


@pytest.mark.parametrize("field", ["groups", "ambient"])
def test_a_report_naming_a_missing_blob_commits_nothing(tmp_path: Path, field: str) -> None:
    store = Store(tmp_path)
    report = _report(store, ["y"], y=3)
    if field == "groups":
        report = dataclasses.replace(report, groups=[("0" * 32, ["y"], 1)])
    else:
        report = dataclasses.replace(report, ambient="0" * 32)
    with pytest.raises(StoreError, match="not in the store"):
        commit(store, "s", None, report, _cell("y = 3", 1))
    assert store.head("s") is None


def test_no_version_is_built_on_a_damaged_head(tmp_path: Path) -> None:
    store = Store(tmp_path)
    head, _ = commit(store, "s", None, _report(store, ["x"], x=1), _cell("x = 1", 1))
    path = tmp_path / "manifests" / head
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="head is damaged"):
        commit(store, "s", head, _report(store, ["x"], x=2), _cell("x = 2", 2))
    assert store.head("s") == head


def test_a_head_moved_meanwhile_or_a_refused_version_commits_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    first, _ = commit(store, "s", None, _report(store, ["x"], x=1), _cell("x = 1", 1))
    second, _ = commit(store, "s", first, _report(store, ["x"], x=2), _cell("x = 2", 2))
    with pytest.raises(StaleHead):
        commit(store, "s", first, _report(store, ["x"], x=3), _cell("x = 3", 2))

    def refuse(manifest: Manifest) -> None:
        raise StoreError(f"version {manifest.version} is over quota")

    with pytest.raises(StoreError, match="over quota"):
        commit(store, "s", second, _report(store, ["x"], x=4), _cell("x = 4", 3), refuse)
    assert store.head("s") == second


def test_a_group_holding_cuda_memory_stays_marked_through_later_versions(tmp_path: Path) -> None:
    store = Store(tmp_path)
    report = _report(store, ["w", "n"], w=[1.0], n=2)
    report = dataclasses.replace(report, devices=[report.groups[0][0]])  # w's, as on a GPU
    first, m1 = commit(store, "s", None, report, _cell("w, n = [1.0], 2\n", 1))
    second, m2 = commit(store, "s", first, _report(store, ["n"], n=3), _cell("n = 3\n", 2))
    for manifest in (m1, m2, Manifest.decode(store.get_manifest(second))):
        assert {n: g.device for n, g in manifest.variables().items()} == {"w": True, "n": False}

"""Whole-state loads: objects streamed in order, read ahead, each buffer its own and verified.

Every test runs twice: large buffers mapped from their chunk files, and read into memory (the
path for chunk sizes that cannot be mapped)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fabric.errors import StoreError
from fabric.snapshot import Store, blob_id, dumps, loads, mapped
from fabric.snapshot import store as store_module

CHUNK = 1 << 16


@pytest.fixture(autouse=True, params=["mapped", "read"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(mapped, "SMALLEST", CHUNK if request.param == "mapped" else 1 << 40)
    return request.param


def _mapped_from(store: Store) -> set[str]:
    """The store's blobs this process maps."""
    root = str(store.disk.root)
    return {Path(line.split()[-1]).name for line in Path("/proc/self/maps").read_text().splitlines()
            if root in line}


def _state() -> dict[str, dict]:
    rng = np.random.default_rng(0)
    return {"a": {"a": rng.random(50_000)},  # 400 kB: 7 chunks, the last one short
            "t": {"t": torch.randn(40_000), "small": [1, 2, 3]},
            "b": {"b": rng.integers(0, 255, 300_000, dtype=np.uint8), "n": "x"}}


def _saved(root: Path, state: dict[str, dict]) -> list[str]:
    store = Store(root, chunk=CHUNK)
    return [store.put_object(dumps(values, {})) for values in state.values()]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("ahead", [1, 1 << 30])  # one object at a time, or all of them at once
def test_a_whole_state_loads_in_order_into_writable_memory_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: int) -> None:
    monkeypatch.setattr(store_module, "AHEAD", ahead)
    state = _state()
    ids = _saved(tmp_path, state)
    store = Store(tmp_path, chunk=CHUNK)  # a fresh process: nothing cached
    chunks = {cid: store.disk.path(cid).read_bytes() for i in ids for cid in store.object_chunks(i)}
    loaded = [loads(encoded, {}) for encoded in store.get_objects(ids)]
    assert [sorted(values) for values in loaded] == [sorted(values) for values in state.values()]
    a, t, b = loaded
    np.testing.assert_array_equal(a["a"], state["a"]["a"])
    assert torch.equal(t["t"], state["t"]["t"]) and t["small"] == [1, 2, 3]
    np.testing.assert_array_equal(b["b"], state["b"]["b"])
    assert a["a"].flags.writeable and b["b"].flags.writeable
    a["a"][:] = -1.0  # every chunk of it written
    t["t"].zero_()
    b["b"][-1] ^= 0xFF
    for cid, data in chunks.items():  # the stored chunks are untouched, and still verify
        assert store.disk.path(cid).read_bytes() == data and blob_id(data) == cid
    again = [loads(encoded, {}) for encoded in Store(tmp_path, chunk=CHUNK).get_objects(ids)]
    np.testing.assert_array_equal(again[0]["a"], state["a"]["a"])
    assert torch.equal(again[1]["t"], state["t"]["t"])


def test_one_object_named_twice_loads_as_two_independent_copies(tmp_path: Path) -> None:
    ident = _saved(tmp_path, {"a": {"a": np.arange(40_000.0)}})[0]
    first, second = (loads(e, {}) for e in Store(tmp_path, chunk=CHUNK).get_objects([ident] * 2))
    first["a"][0] = 7.0
    assert second["a"][0] == 0.0


def test_a_corrupt_chunk_is_refused_when_its_object_is_reached_and_loads_once_repaired(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "AHEAD", 1 << 30)  # read before the first object is out
    ids = _saved(tmp_path / "s", _state())
    shutil.copytree(tmp_path / "s", tmp_path / "backup")
    store = Store(tmp_path / "s", chunk=CHUNK)
    victim = store.object_chunks(ids[2])[3]
    _flip(store.disk.path(victim), 11)
    objects = store.get_objects(ids)
    assert loads(next(objects), {})["a"].shape == (50_000,)  # earlier objects are intact
    next(objects)
    with pytest.raises(StoreError, match="corrupt") as info:
        next(objects)
    assert info.value.fields["blob"] == victim
    assert store.repair(victim, [Store(tmp_path / "backup").disk])
    b = [loads(e, {}) for e in store.get_objects(ids)][2]["b"]
    np.testing.assert_array_equal(b, _state()["b"]["b"])


def test_an_abandoned_load_leaves_the_store_usable(tmp_path: Path) -> None:
    ids = _saved(tmp_path, _state())
    store = Store(tmp_path, chunk=CHUNK)
    objects = store.get_objects(ids)
    next(objects)
    objects.close()  # stops the reads of the objects nobody will unpickle
    assert loads(store.get_object(ids[1]), {})["small"] == [1, 2, 3]


def test_a_mapped_buffer_is_its_chunk_files_in_order_and_copies_a_page_only_when_written(
        tmp_path: Path, way: str) -> None:
    original = np.random.default_rng(1).random(50_000)  # 7 chunks, the last one short
    ident = _saved(tmp_path, {"a": {"a": original}})[0]
    store = Store(tmp_path, chunk=CHUNK)
    chunks = store.object_chunks(ident)
    a = loads(store.get_object(ident), {})["a"]
    assert _mapped_from(store) == (set(chunks) if way == "mapped" else set())
    np.testing.assert_array_equal(a, original)
    a[::1000] = -1.0  # a page of every chunk: copied, the files untouched
    assert all(blob_id(store.disk.path(c).read_bytes()) == c for c in chunks)
    np.testing.assert_array_equal(loads(store.get_object(ident), {})["a"], original)
    del a
    assert _mapped_from(store) == set()  # unmapped with the last array on it

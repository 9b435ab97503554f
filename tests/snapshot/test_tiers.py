"""A store's tiers plug in: a tier of a kind the store was never told of, given in the configured
order, is read from in that order and makes commits durable, as the remote does."""

from __future__ import annotations

import collections
import dataclasses
import uuid
from pathlib import Path

import numpy as np
import pytest

from fabric.errors import ConfigError
from fabric.snapshot import Manifest, Store, catalog, codec
from fabric.snapshot.commit import CellRecord, Report, commit, replicate, spreads
from fabric.snapshot.layers import Place
from fabric.snapshot.tiers import Buffer, Role


class Shelf:
    """A durable far tier in this process's memory that counts the blobs read from it."""

    name, role, durable = "shelf", Role.FAR, True

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.reads: collections.Counter[str] = collections.Counter()

    def has(self, ident: str) -> bool:
        return ident in self.blobs

    def size(self, ident: str) -> int | None:
        found = self.blobs.get(ident)
        return None if found is None else len(found)

    def read_into(self, ident: str, out: memoryview) -> int | None:
        found = self.blobs.get(ident)
        if found is None:
            return None
        self.reads[ident] += 1
        out[:min(len(found), out.nbytes)] = found[:out.nbytes]
        return len(found)

    def write(self, ident: str, data: Buffer) -> None:
        self.blobs[ident] = bytes(data)


SHELVES: dict[Path, Shelf] = {}


def shelf(place: Place) -> Shelf:
    """The shelf of the store whose blobs are at `place` (a kind named in configuration)."""
    return SHELVES.setdefault(place.blobs, Shelf())


@pytest.fixture
def remote() -> str:
    return f"memory://llfabric-{uuid.uuid4().hex}"


@pytest.mark.parametrize("shelf_first", [True, False])
def test_reads_are_sourced_from_the_nearest_tier_that_holds_the_blob(
        tmp_path: Path, remote: str, shelf_first: bool) -> None:
    shared = Shelf()
    far = [shared, "remote"] if shelf_first else ["remote", shared]
    here = Store(tmp_path / "here", remote=remote, tiers=["memory", "disk", *far])
    both = here.put(b"on the shelf and the remote")  # the server's own blobs go to both
    remote_only = Store(tmp_path / "here", remote=remote).put(b"only on the remote")
    assert shared.has(both) and not shared.has(remote_only)
    there = Store(tmp_path / "there", key=here.key, remote=remote,
                  tiers=["memory", "disk", *far])
    assert there.fetch([both, remote_only]) > 0
    assert there.get(both) == b"on the shelf and the remote"
    assert there.get(remote_only) == b"only on the remote"
    nearest = "shelf" if shelf_first else "remote"
    assert there.sourced[nearest] >= len(b"on the shelf and the remote")
    assert shared.reads[both] == (1 if shelf_first else 0)
    assert there.sourced["remote"] >= len(b"only on the remote")


def test_a_commit_is_durable_through_a_tier_named_in_configuration(tmp_path: Path) -> None:
    tiers = ["memory", "disk", f"{__name__}:shelf"]
    store = Store(tmp_path / "host", chunk=1 << 20, tiers=tiers)
    keeper = SHELVES[tmp_path / "host" / "blobs"]
    worker = Store(tmp_path / "host", chunk=1 << 20, signs=False)  # what a worker writes
    values = {"x": np.arange(600_000)}
    group = worker.put_object(codec.dumps(values, {}))
    ambient = worker.put(b"the ambient state")
    report = Report(groups=[(group, ["x"], 4_800_000)], kept=[], imports={}, refs={},
                    packages={}, ambient=ambient, owned=["x"], unsaved={})
    assert not spreads(store)  # a durable far tier holds each commit: none goes to peers
    assert replicate(store, "s", Manifest(session="s"), report) > 4_800_000  # before it moves
    assert all(map(keeper.has, [group, ambient, *store.object_chunks(group)]))
    head, manifest = commit(store, "s", None, report, CellRecord("x = ...", 1, "ok", 0.1,
                                                                frozenset()))
    assert head is not None and store.head("s") == head
    for blob in [group, *store.object_chunks(group)]:  # this host's disk loses them
        store.disk.remove(blob)
    assert store.fetch([g.blob for g in manifest.groups])
    assert np.array_equal(codec.loads(store.get_object(group), {})["x"], values["x"])
    assert store.sourced["shelf"] > 4_800_000


def test_a_commit_names_no_blob_its_durable_tier_lacks_though_this_disk_held_it(
        tmp_path: Path) -> None:
    """A version's catalog, which the server writes, is on the durable far tier before the
    head moves, even where this disk held it already and the tier did not (its write failed
    there after it was made here, or the tier lost it)."""
    shelf = Shelf()
    store = Store(tmp_path / "host", tiers=["memory", "disk", shelf])
    worker = Store(tmp_path / "host", signs=False)
    report = Report(groups=[(worker.put_object(codec.dumps({"x": 1}, {})), ["x"], 8)], kept=[],
                    imports={}, refs={}, packages={}, ambient=worker.put(b"ambient"),
                    owned=["x"], unsaved={}, described=catalog.describe({"x": 1}, ["x"]))
    cell = CellRecord("x = 1", 1, "ok", 0.1, frozenset())
    head, first = commit(store, "s", None, report, cell)
    assert first.catalog is not None and shelf.has(first.catalog)
    del shelf.blobs[first.catalog]
    report = dataclasses.replace(report, ambient=worker.put(b"another ambient"))
    _, second = commit(store, "s", head, report, cell)
    assert second.catalog == first.catalog and shelf.has(second.catalog)


def test_a_tier_the_configuration_names_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no store tier is called 'tape'"):
        Store(tmp_path, tiers=["memory", "disk", "tape"])
    with pytest.raises(ConfigError, match=r"no store tier is called 'no\.such:module'"):
        Store(tmp_path, tiers=["disk", "no.such:module"])
    with pytest.raises(ConfigError, match="one local disk"):
        Store(tmp_path, tiers=["memory"])

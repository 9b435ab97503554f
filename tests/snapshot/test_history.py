"""History and upkeep on a real store: log, checkout, verify, gc."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import commit_values

from fabric.errors import StoreError
from fabric.snapshot import Manifest, Store, dumps, history, loads, retention

CHUNK = 1 << 16


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def _age_all(root: Path, seconds: float) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            _age(path, seconds)


def test_log_lists_versions_newest_first_and_checkout_appends_the_old_state(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    commit_values(store, "s", x=1)
    commit_values(store, "s", x=2)
    assert [m.version for _, m in history.log(store, "s")] == [2, 1]
    new = history.checkout(store, "s", 1)
    assert new.version == 3 and new.cell["checkout"] == 1
    versions = history.log(store, "s")
    assert [m.version for _, m in versions] == [3, 2, 1]  # the future stays in the history
    blob = versions[0][1].variables()["x"].blob
    assert loads(store.get_object(blob), {}) == {"x": 1}
    with pytest.raises(StoreError, match="no version 9"):
        history.checkout(store, "s", 9)


def test_describe_tells_each_version_s_cell_size_and_changed_names(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    commit_values(store, "s", x=1, y="why")
    commit_values(store, "s", x=2)
    history.tag(store, "s", 1, "first")
    history.checkout(store, "s", 1)
    assert history.retain(store, "s", retention.RetentionPolicy(last=1, hourly=0, daily=0)) == [2]
    described = history.describe(history.log(store, "s"), store.index("s"))
    assert [v["version"] for v in described] == [3, 2, 1]
    back, thinned, first = described
    assert back["checkout"] == 1 and back["first_line"] == "" and back["lines"] == 0
    assert (back["added"], back["changed"], back["removed"]) == (["y"], ["x"], [])
    assert thinned["size"] is None and thinned["variables"] == 1  # its cell is still known
    assert (thinned["added"], thinned["changed"], thinned["removed"]) == ([], ["x"], ["y"])
    assert first["tags"] == ["first"] and first["size"] > 0 and first["checkout"] is None
    assert (first["first_line"], first["execution_count"], first["status"]) == ("x", 1, "ok")
    assert (first["added"], first["more"]) == (["x", "y"], 0)


def test_describe_lists_a_few_changed_names_and_counts_the_rest(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    commit_values(store, "s", **{f"v{i:02}": i for i in range(history.CHANGED_NAMES + 5)})
    [only] = history.describe(history.log(store, "s"), store.index("s"))
    assert len(only["added"]) == history.CHANGED_NAMES and only["more"] == 5


def test_gc_keeps_every_blob_a_history_names_and_removes_the_rest(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    commit_values(store, "s", a=np.arange(50_000.0), b="small")
    commit_values(store, "s", a=np.arange(50_000.0) + 1)
    live = {p for p in (tmp_path / "blobs").rglob("*") if p.is_file()}
    noise = np.random.default_rng(0).random(40_000)
    orphan = store.put_object(dumps({"o": noise}, {}))  # a save never committed
    orphans = {store.disk.path(i) for i in [orphan, *store.object_chunks(orphan)]}
    _age_all(tmp_path, 2 * history.GRACE_SECONDS)
    result = history.gc(store)
    assert result.removed == len(orphans) and result.freed > 40_000 * 8
    assert all(p.exists() for p in live)  # both versions stay checkable out
    assert not any(p.exists() for p in orphans)
    assert not history.verify(store).problems


def test_gc_spares_a_save_in_flight_with_its_reused_chunks(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    data = np.arange(50_000.0)
    old = store.put_object(dumps({"a": data}, {}))
    _age_all(tmp_path, 2 * history.GRACE_SECONDS)
    # a worker saving now reuses the old chunks and writes a new index; nothing committed yet
    fresh = store.put_object(dumps({"a": data, "b": 1}, {}))
    assert history.gc(store).removed == 1  # only the old, unreferenced index
    assert not store.disk.has(old)
    assert loads(store.get_object(fresh), {})["b"] == 1


def test_gc_spares_a_blob_a_save_reuses_after_the_pass_read_its_time(tmp_path,
                                                                   monkeypatch) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    blob = store.put(b"a value back to what a released version held")
    _age_all(tmp_path, 2 * history.GRACE_SECONDS)  # named by nothing, and old: garbage
    read = Path.stat
    touched: list[Path] = []

    def stat(path: Path, *args: object, **kwargs: object) -> os.stat_result:
        result = read(path, *args, **kwargs)
        if path.name == blob and not touched:  # a save began after the pass did:
            touched.append(path)  # it finds the blob intact and touches it to name it
            store.disk.touch(blob)
        return result

    monkeypatch.setattr(Path, "stat", stat)
    assert history.gc(store).removed == 0 and touched
    assert store.get(blob) == b"a value back to what a released version held"


def _flip(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_gc_keeps_a_damaged_session_whole_and_collects_the_others(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    commit_values(store, "broken", a=np.arange(50_000.0))
    first = {p for p in (tmp_path / "blobs").rglob("*") if p.is_file()}
    head = commit_values(store, "broken", b="second")
    blob = history.log(store, "broken")[1][1].groups[0].blob
    store.disk.path(store.object_chunks(blob)[0]).unlink()  # a missing chunk, and
    _flip(tmp_path / "manifests" / head, 10)  # a corrupt head: its history ends here
    commit_values(store, "fine", c=np.arange(1000.0))
    orphan = store.put_object(dumps({"o": np.random.default_rng(0).random(40_000)}, {}))
    _age_all(tmp_path, 2 * history.GRACE_SECONDS)
    result = history.gc(store)
    assert set(result.damaged) == {"broken"} and "corrupt" in result.damaged["broken"]
    assert not store.disk.has(orphan)  # the others' garbage went
    assert all(p.exists() for p in first if p.name != store.object_chunks(blob)[0])
    assert (tmp_path / "manifests" / head).exists()
    assert [m.version for _, m in history.log(store, "fine")] == [1]


def test_a_save_rewrites_a_corrupt_chunk_it_would_have_skipped(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    encoded = dumps({"a": np.arange(50_000.0)}, {})
    ident = store.put_object(encoded)
    chunk = store.disk.path(store.object_chunks(ident)[1])
    _flip(chunk)
    assert store.put_object(dumps({"a": np.arange(50_000.0)}, {})) == ident
    assert loads(Store(tmp_path).get_object(ident), {})["a"][-1] == 49_999.0
    chunk.write_bytes(chunk.read_bytes()[:-1])  # truncated: its size alone gives it away
    store.put_object(dumps({"a": np.arange(50_000.0)}, {}))
    assert not history.verify(store).problems


def test_verify_repairs_corrupt_blobs_from_a_good_copy_and_names_the_rest(tmp_path) -> None:
    store = Store(tmp_path / "store", chunk=CHUNK)
    backup = Store(tmp_path / "backup", chunk=CHUNK)
    commit_values(store, "s", a=np.arange(50_000.0), b=np.arange(20_000.0) * 2)
    groups = history.log(store, "s")[0][1].groups
    backup.put_object(dumps({"a": np.arange(50_000.0)}, {}))  # a copy of a's bytes only
    healable = store.disk.path(store.object_chunks(groups[0].blob)[0])
    lost = store.disk.path(store.object_chunks(groups[1].blob)[0])
    _flip(healable)
    _flip(lost)
    assert history.verify(store, repair=True).repaired == sorted([healable.name, lost.name])
    _flip(healable)  # the store's memory tier had both; a new process has no copy but backup's
    _flip(lost)
    store = Store(tmp_path / "store", chunk=CHUNK)
    result = history.verify(store, repair=True, sources=[backup.disk])
    assert result.repaired == [healable.name]
    assert len(result.problems) == 1
    assert lost.name in result.problems[0] and "sessions s need it" in result.problems[0]
    assert loads(store.get_object(groups[0].blob), {})["a"][7] == 7.0


def test_verify_reports_corrupt_blobs_and_unsigned_manifests(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    ident = commit_values(store, "s", a=np.arange(50_000.0))
    assert history.verify(store).problems == []
    chunk = store.object_chunks(history.log(store, "s")[0][1].groups[0].blob)[2]
    path = store.disk.path(chunk)
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    manifest = tmp_path / "manifests" / ident
    data = bytearray(manifest.read_bytes())
    data[10] ^= 1
    manifest.write_bytes(bytes(data))
    problems = history.verify(store).problems
    assert any(chunk in p and "corrupt" in p for p in problems)
    assert any(ident in p for p in problems)


def _changed_from_now(folder: Path) -> float:
    """A time after every file change so far and before every one to come: file times lag the
    clock by up to a tick, so it is read from a file, written until its time moves on."""
    probe, newest = folder / "probe", max(p.lstat().st_ctime for p in folder.rglob("*"))
    while True:
        probe.write_bytes(b"")
        if (changed := probe.lstat().st_ctime) > newest:
            probe.unlink()
            return changed


def test_verify_since_a_time_checks_only_what_was_written_or_changed_since(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    commit_values(store, "old", a=np.arange(50_000.0))
    assert history.last_verified(store) is None
    full = history.verify(store)
    assert not full.problems and history.last_verified(store) is not None
    since = _changed_from_now(tmp_path)
    commit_values(store, "new", b=np.arange(40_000.0) * 3)
    old_chunk = store.disk.path(store.object_chunks(
        history.log(store, "old")[0][1].groups[0].blob)[0])
    _flip(old_chunk)  # written since: its change time says so, whatever its modification time
    os.utime(old_chunk, (0, 0))
    result = history.verify(store, since=since)
    assert 0 < result.blobs < history.verify(Store(tmp_path, chunk=CHUNK)).blobs
    assert list(result.held) == ["new"] and result.manifests == 1
    assert len(result.problems) == 1 and old_chunk.name in result.problems[0]
    recorded = history.last_verified(store)
    history.verify(store)  # found something wrong: the last whole one stays on record
    assert history.last_verified(store) == recorded


def test_lineage_names_the_cells_that_made_unsaved_state(tmp_path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    head = None
    cells = [("x = [1, 2]", []), ("gen = iter(x)", ["gen"]), ("y = 1", ["gen"]),
             ("first = next(gen)", ["gen"])]
    for count, (source, unsaved) in enumerate(cells, 1):
        manifest = Manifest(session="s", version=count, parent=head,
                            cell={"execution_count": count, "source": source,
                                  "unsaved": unsaved})
        store.set_head("s", store.put_manifest(manifest.encode()), head)
        head = store.head("s")
    assert history.lineage(store, "s", ["gen"]) == [2, 4]
    assert history.recompute_hint(store, "s", ["gen"]) == " (re-run cells 2, 4 to recompute them)"
    assert history.recompute_hint(store, "s", ["never"]) == ""


def test_gc_never_collects_through_a_shard_that_is_a_link(tmp_path) -> None:
    """A user owns their part's blobs/ and could link a shard of it to another user's: gc of
    their part must not delete the other's blobs, which their history does not name."""
    theirs = Store(tmp_path / "a", chunk=CHUNK)
    commit_values(theirs, "s", x="a's state")
    blob = next(p for p in (tmp_path / "a" / "blobs").rglob("*") if p.is_file())
    mine = Store(tmp_path / "b", chunk=CHUNK)
    (tmp_path / "b" / "blobs" / blob.parent.name).symlink_to(blob.parent)
    _age_all(tmp_path / "a", 2 * history.GRACE_SECONDS)
    history.gc(mine)
    assert blob.exists()

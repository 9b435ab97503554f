"""Retention: the policy's properties, and thinning, tags, removal and gc on a real store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import commit_values
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.errors import FabricError, StoreError
from fabric.snapshot import Manifest, Store, dumps, history, loads
from fabric.snapshot.retention import DAY, HOUR, RetentionPolicy, Version, due, keep

CHUNK = 1 << 16
ROOT = Path(__file__).resolve().parent.parent.parent

NOW = 1_800_000_000.0

policies = st.builds(RetentionPolicy, st.integers(0, 30), st.integers(0, 48), st.integers(0, 14))


@st.composite
def histories(draw) -> list[Version]:
    ages = draw(st.lists(st.floats(0, 30 * DAY), max_size=200))
    return [Version(n, NOW - age, draw(st.booleans()) and n % 7 == 0, n % 13 == 0)
            for n, age in enumerate(sorted(ages, reverse=True))]


@settings(max_examples=300, deadline=None)
@given(histories(), policies)
def test_the_policy_keeps_head_named_and_protected_and_a_bounded_rest(versions, policy) -> None:
    kept = keep(versions, policy, NOW)
    if versions:
        assert versions[-1].number in kept  # the head
    assert {v.number for v in versions if v.named or v.protected} <= kept
    assert kept <= {v.number for v in versions}
    pinned = sum(v.named or v.protected for v in versions)
    assert len(kept) <= policy.bound() + pinned
    assert keep([v for v in versions if v.number in kept], policy, NOW) == kept  # stable


@settings(max_examples=300, deadline=None)
@given(histories(), policies, st.floats(0, 1))
def test_what_the_policy_kept_stays_kept_until_it_is_due(versions, policy, share) -> None:
    kept = [v for v in versions if v.number in keep(versions, policy, NOW)]
    until = due(kept, policy, NOW)
    assert until > NOW
    later = NOW + share * (min(until, NOW + 30 * DAY) - NOW)
    if later < until:  # a pass before it is due thins nothing
        assert keep(kept, policy, later) == {v.number for v in kept}


def test_the_policy_thins_old_versions_to_one_per_hour_then_one_per_day() -> None:
    # a version every 10 minutes for three days
    versions = [Version(n, NOW - (432 - n) * 600) for n in range(433)]
    kept = keep(versions, RetentionPolicy(last=5, hourly=24, daily=7), NOW)
    assert set(range(428, 433)) <= kept
    older = [versions[n] for n in kept if n < 428]
    hours = [int(v.time // HOUR) for v in older if v.time > NOW - 23 * HOUR]
    assert len(hours) == len(set(hours)) >= 20  # one per hour over the last day
    days = [int(v.time // DAY) for v in older if v.time <= NOW - 24 * HOUR]
    assert len(days) == len(set(days)) >= 1  # then one per day
    assert len(kept) <= 5 + 24 + 7
    assert not any(v.number in kept for v in versions if v.time < NOW - 4 * DAY)


def test_a_policy_refuses_negative_counts() -> None:
    with pytest.raises(FabricError, match="last"):
        RetentionPolicy(last=-1)


def _store_with(tmp_path, cells: int) -> Store:
    store = Store(tmp_path, chunk=CHUNK)
    for i in range(cells):
        commit_values(store, "s", w=np.random.default_rng(i).random(40_000))
    return store


def test_retention_thins_data_keeps_tombstones_and_gc_frees_it_at_once(tmp_path) -> None:
    store = _store_with(tmp_path, 12)
    history.tag(store, "s", 3, "baseline")
    before = history.verify(store).bytes
    thinned = history.retain(store, "s", RetentionPolicy(last=4, hourly=0, daily=0))
    assert sorted(thinned) == [1, 2, 4, 5, 6, 7, 8]
    assert [m.version for _, m in history.log(store, "s")] == list(range(12, 0, -1))
    freed = history.gc(store)  # no grace needed: these were committed, then released
    assert freed.removed >= 7 and freed.freed >= 7 * 320_000
    after = history.verify(store)
    assert not after.problems and after.bytes < before / 2
    assert after.held["s"] <= 5 * 330_000
    kept = history.checkout(store, "s", "baseline")
    blob = kept.variables()["w"].blob
    assert (loads(store.get_object(blob), {})["w"] == np.random.default_rng(2).random(40_000)).all()
    with pytest.raises(StoreError, match=r"thinned away.*these remain: 13, 12, 11, 10, 9, "
                                         r"3 \(baseline\)"):
        history.checkout(store, "s", 5)
    assert history.gc(store).removed == 0  # incremental: nothing is released twice


def test_a_session_policy_overrides_the_store_one_and_tags_are_checked(tmp_path) -> None:
    store = _store_with(tmp_path, 6)
    with store.locked("s"):
        index = store.index("s")
        index.policy = {"last": 2}
        store.set_index("s", index)
    thinned = history.retain(store, "s", RetentionPolicy(last=20, hourly=0, daily=0))
    assert sorted(thinned) == [1, 2, 3, 4]
    with pytest.raises(StoreError, match="invalid version name"):
        history.tag(store, "s", 6, "123")
    with pytest.raises(StoreError, match="thinned away"):
        history.tag(store, "s", 2, "late")
    with pytest.raises(StoreError, match="no version named 'nope'"):
        history.checkout(store, "s", "nope")


def test_a_malformed_index_is_a_store_error(tmp_path) -> None:
    store = _store_with(tmp_path, 1)
    (tmp_path / "sessions" / "s" / "index").write_bytes(b"\x93garbage")
    with pytest.raises(StoreError, match="malformed index"):
        history.retain(store, "s", RetentionPolicy())


def test_a_save_that_reuses_a_released_chunk_keeps_it(tmp_path) -> None:
    store = _store_with(tmp_path, 3)
    history.retain(store, "s", RetentionPolicy(last=1, hourly=0, daily=0))
    # a save in flight writes version 1's bytes again: the intact chunks are touched, not written
    encoded = dumps({"w": np.random.default_rng(0).random(40_000)}, {})
    _, _, chunks = store.fingerprint(encoded)
    ident = store.put_object(encoded)
    history.gc(store)
    assert store.has(ident) and all(store.has(c) for c, _ in chunks)


def test_removing_a_session_frees_what_only_it_named(tmp_path) -> None:
    store = _store_with(tmp_path, 3)
    commit_values(store, "t", v=np.arange(1000.0))
    assert history.remove(store, "s")
    assert store.sessions() == ["t"]
    history.gc(store)
    result = history.verify(store)
    assert not result.problems and result.manifests == 1 and list(result.held) == ["t"]
    assert not history.remove(store, "s")


def test_a_blob_a_running_save_reused_stays_though_retention_releases_it_after(
        tmp_path) -> None:
    """A cell sets a value back to what a version about to be thinned holds: its save reuses
    that version's blob, then a pass thins the version and frees its data before the cell
    commits. Told when the cell began, gc keeps the blob the commit will name."""
    store = Store(tmp_path, chunk=CHUNK)
    first = np.random.default_rng(0).random(40_000)
    commit_values(store, "s", w=first)
    for i in range(1, 4):
        commit_values(store, "s", w=np.random.default_rng(i).random(40_000))
    began = time.time()
    reused = store.put_object(dumps({"w": first}, {}))  # the running cell's save
    thinned = history.retain(store, "s", RetentionPolicy(last=1, hourly=0, daily=0))
    assert sorted(thinned) == [1, 2, 3]
    history.gc(store, saving_since=began)
    assert store.has(reused) and all(store.has(c) for c in store.object_chunks(reused))
    assert np.array_equal(loads(store.get_object(reused), {})["w"], first)


def test_an_unchanged_group_a_running_save_names_again_stays(tmp_path) -> None:
    """As above, where the worker still holds the object it loaded long ago (`known`): the save
    writes nothing, yet the object it names again is kept."""
    store = Store(tmp_path, chunk=CHUNK)
    first = np.random.default_rng(0).random(40_000)
    commit_values(store, "s", w=first)
    [group] = Manifest.decode(store.get_manifest(store.head("s"))).groups
    known = group.blob
    for path in store.disk.files():  # written long before the cell began
        os.utime(path, (time.time() - 100, time.time() - 100))
    for i in range(1, 4):
        commit_values(store, "s", w=np.random.default_rng(i).random(40_000))
    began = time.time()
    assert store.put_object(dumps({"w": first}, {}), known) == known
    thinned = history.retain(store, "s", RetentionPolicy(last=1, hourly=0, daily=0))
    assert sorted(thinned) == [1, 2, 3]
    history.gc(store, saving_since=began)
    assert store.has(known) and all(store.has(c) for c in store.object_chunks(known))


def test_a_gc_pass_during_a_removal_does_not_lose_what_it_released(tmp_path) -> None:
    """A pass that starts while the session is being removed still sees it and keeps its data:
    the next pass frees that data at once, with no grace period to wait out."""
    store = _store_with(tmp_path, 3)
    remove_session = store.remove_session

    def gc_then_remove(session: str) -> bool:
        history.gc(store)  # the server's upkeep, in a thread, as `rm` runs
        return remove_session(session)

    store.remove_session = gc_then_remove
    assert history.remove(store, "s")
    history.gc(store)
    assert not any(store.disk.files()) and not any((store.root / "released").iterdir())


@pytest.mark.parametrize("folder", ["released", "sessions/s"])
def test_gc_leaves_a_file_being_written_and_clears_one_a_crash_left(tmp_path,
                                                                    folder: str) -> None:
    """A removal record's or a head's or index's temp file (`write_atomic`'s)."""
    store = _store_with(tmp_path / "store", 1)
    (store.root / folder).mkdir(exist_ok=True)
    writing, crashed = store.root / folder / ".tmp-writing", store.root / folder / ".tmp-crashed"
    elsewhere = tmp_path / "elsewhere"  # what a link in the store points at is not its own
    elsewhere.mkdir()
    (elsewhere / ".tmp-theirs").write_bytes(b"")
    (store.root / "sessions" / "linked").symlink_to(elsewhere)
    old = time.time() - 2 * history.GRACE_SECONDS
    for path in (writing, crashed, elsewhere / ".tmp-theirs"):
        path.write_bytes(b"")
    for path in (crashed, elsewhere / ".tmp-theirs"):
        os.utime(path, (old, old))
    history.gc(store)
    assert writing.exists() and not crashed.exists() and (elsewhere / ".tmp-theirs").exists()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_cli_names_thins_checks_out_by_name_and_removes(tmp_path) -> None:
    store = _store_with(tmp_path / "store", 6)
    commit_values(store, "other", v=np.arange(10.0))
    where = ("--store", str(tmp_path / "store"))
    assert _cli("store", "tag", "s", "2", "good", *where).returncode == 0
    result = _cli("store", "retain", "s", "--last", "2", *where)
    assert "keeps its newest 2 versions" in result.stdout, result.stderr
    result = _cli("store", "gc", *where)
    assert "session s: thinned 3 versions" in result.stdout, result.stderr
    log = _cli("store", "log", "s", *where).stdout.splitlines()
    assert [line.split()[0] for line in log] == ["6", "5", "4", "3", "2", "1"]
    assert "[good]" in log[4] and all("thinned" in log[i] for i in (2, 3, 5))
    result = _cli("store", "checkout", "s", "good", *where)
    assert "the state of version 2" in result.stdout, result.stderr
    result = _cli("store", "checkout", "s", "3", *where)
    assert result.returncode != 0 and "these remain: 7, 6, 5, 2 (good)" in result.stderr
    result = _cli("store", "verify", *where)
    assert result.returncode == 0 and "session s holds" in result.stdout, result.stderr
    assert _cli("store", "rm", "s", *where).returncode == 0
    assert Store(tmp_path / "store").sessions() == ["other"]
    assert _cli("store", "rm", "s", *where).returncode != 0

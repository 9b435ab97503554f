"""Upkeep that costs what changed: a `Ledger`'s passes against full ones (`history.retain` on
every session, `history.gc`) on copies of the same store, across restarts and cut-short writes."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import xxhash
from helpers import commit_values

from fabric.errors import StoreError
from fabric.snapshot import Encoded, Group, Manifest, Store, dumps, history
from fabric.snapshot.ledger import _MAGIC as ledger_magic
from fabric.snapshot.ledger import Ledger
from fabric.snapshot.packing import pack, unpack
from fabric.snapshot.retention import HOUR, RetentionPolicy

CHUNK = 1 << 16
POLICY = RetentionPolicy(last=2, hourly=0, daily=0)


def _commit(store: Store, session: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    commit_values(store, session, w=rng.random(20_000), small=seed)


def _files(root: Path) -> set[str]:
    return {p.name for top in ("blobs", "manifests") for p in (root / top).rglob("*")
            if p.is_file()}


def _full_pass(root: Path, protect: set[str], now: float) -> set[str]:
    """The files a full retention and gc pass leaves of a copy of the store at `root`."""
    copy = root.parent / f"{root.name}-full"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy)  # file times kept: gc's rules see the same store
    store = Store(copy, chunk=CHUNK)
    for session in store.sessions():
        with contextlib.suppress(StoreError):  # a damaged one keeps everything
            history.retain(store, session, POLICY, protect, now)
    history.gc(store)
    return _files(copy)


def _two_sessions(root: Path, first: str, second: str) -> Store:
    """A store where sessions `first` and `second` committed three versions each."""
    store = Store(root, chunk=CHUNK)
    for i in range(3):
        _commit(store, first, i)
        _commit(store, second, 10 + i)
    return store


def _pass(ledger: Ledger, protect: set[str], now: float) -> history.Collected:
    ledger.retain(POLICY, protect, now)
    return ledger.collect()


def _changes(store: Store, start: int) -> None:
    """Commits on two sessions, a name, a new session and a removed one."""
    for i in range(start, start + 3):
        _commit(store, "a", i)
    _commit(store, "b", start + 10)
    history.tag(store, "b", None, f"named{start}")
    _commit(store, f"new{start}", start + 20)
    history.remove(store, "c")


def test_passes_after_changes_leave_what_full_passes_leave(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root, chunk=CHUNK)
    for i in range(4):
        for session in ("a", "b", "c", "d"):
            _commit(store, session, 100 * i + ord(session))
    ledger = Ledger(store)
    now = time.time()
    expected = _full_pass(root, set(), now)
    _pass(ledger, set(), now)
    assert _files(root) == expected
    _changes(store, 1000)
    expected = _full_pass(root, set(), now)
    result = _pass(ledger, set(), now)
    assert _files(root) == expected and result.removed > 0
    assert not history.verify(store).problems


def _commit_at(store: Store, session: str, when: float) -> None:
    """Commit a version of one small group whose cell ran at `when`."""
    head = store.head(session)
    number = Manifest.decode(store.get_manifest(head)).version + 1 if head else 1
    group = Group(store.put_object(dumps({"w": number}, {})), ("w",), 1)
    manifest = Manifest(session=session, version=number, parent=head, groups=(group,),
                        cell={"execution_count": number, "status": "ok", "time": when})
    store.set_head(session, store.put_manifest(manifest.encode()), head)


def test_a_session_is_thinned_once_its_versions_age_or_lose_protection(tmp_path: Path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    for hour in range(10, 14):  # versions 1 to 4, an hour apart
        _commit_at(store, "a", hour * HOUR)
    versions = history.log(store, "a")
    head, protected = versions[0][0], versions[2][0]  # version 2: protected
    ledger = Ledger(store)
    policy = RetentionPolicy(last=1, hourly=2, daily=0)
    assert ledger.retain(policy, {protected}, 13.5 * HOUR) == 1  # version 1
    assert ledger.retain(policy, {protected}, 13.6 * HOUR) == 0
    assert ledger.retain(policy, {protected}, 14.5 * HOUR) == 1  # version 3: its hour is gone
    assert ledger.retain(policy, {protected}, 14.6 * HOUR) == 0
    assert ledger.retain(policy, {head}, 14.7 * HOUR) == 1  # version 2: no longer protected
    thinned = store.index("a").thinned
    assert [m.version for i, m in history.log(store, "a") if i not in thinned] == [4]


def test_changes_made_by_another_process_are_seen(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root, chunk=CHUNK)
    for i in range(4):
        _commit(store, "a", i)
    ledger = Ledger(store)
    now = time.time()
    _pass(ledger, set(), now)
    other = Store(root, chunk=CHUNK)  # the CLI's view, say
    for i in range(4, 7):
        _commit(other, "a", i)
    with other.locked("a"):
        index = other.index("a")
        index.policy = {"last": 1}
        other.set_index("a", index)
    expected = _full_pass(root, set(), now)
    _pass(ledger, set(), now)
    assert _files(root) == expected
    assert len([i for i, _ in history.log(store, "a") if i not in store.index("a").thinned]) == 1


def test_a_restart_or_a_pass_cut_short_loses_no_change(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = _two_sessions(root, "a", "b")
    now = time.time()
    _pass(Ledger(store), set(), now)
    _changes(store, 1000)
    assert store.take_changed()  # a pass took the marks, then its server died
    restarted = Store(root, chunk=CHUNK)
    expected = _full_pass(root, set(), now)
    _pass(Ledger(restarted), set(), now)
    assert _files(root) == expected and not history.verify(restarted).problems


def test_the_first_pass_frees_what_nothing_names_and_later_passes_leave_young_saves(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root, chunk=CHUNK)
    _commit(store, "a", 0)
    orphan = store.put_object(_value(1))  # a save whose commit failed, long ago
    for path in store.disk.files():
        os.utime(path, (time.time() - 2 * history.GRACE_SECONDS,) * 2)
    _commit(store, "a", 1)
    ledger = Ledger(store)
    _pass(ledger, set(), time.time())
    assert not store.has(orphan)
    in_flight = store.put_object(_value(2))  # a save not committed yet
    _commit(store, "a", 2)
    _pass(ledger, set(), time.time())
    assert store.has(in_flight)
    assert all(store.has(c) for c in store.object_chunks(in_flight))


def history_free_object(seed: int = 1):
    from fabric.snapshot import dumps
    return dumps({"x": np.random.default_rng(seed).random(20_000)}, {})


def _value(seed: int) -> Encoded:
    return dumps({"x": np.random.default_rng(seed).random(20_000)}, {})


def test_chunk_lists_outlive_the_store_object(tmp_path: Path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    _commit(store, "a", 0)
    [group] = [g for g in _head(store).groups if g.names == ("w",)]
    chunks = store.object_chunks(group.blob)
    assert chunks
    store.disk.path(group.blob).write_bytes(b"damaged")  # its chunks are known without it
    assert Store(tmp_path, chunk=CHUNK).object_chunks(group.blob) == chunks


def test_a_chunk_list_a_crash_cut_short_is_read_again_from_its_index(tmp_path: Path) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    for i in range(3):
        _commit(store, "a", i)
    history.gc(store)  # every live object's chunk list is remembered
    objects = [g.blob for _, m in history.log(store, "a") for g in m.groups]
    chunks = {o: store.object_chunks(o) for o in objects}
    lists = tmp_path / "chunks"
    data = lists.read_bytes()
    lists.write_bytes(data[:-10])  # the last line cut short
    _commit(store, "b", 7)
    history.gc(Store(tmp_path, chunk=CHUNK))  # appends lines after the torn one
    fresh = Store(tmp_path, chunk=CHUNK)
    assert {o: fresh.object_chunks(o) for o in objects} == chunks
    assert not history.verify(fresh).problems


def _head(store: Store) -> Manifest:
    return Manifest.decode(store.get_manifest(store.head("a")))


def test_a_damaged_session_keeps_what_still_reads_while_the_others_are_collected(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = _two_sessions(root, "broken", "fine")
    ledger = Ledger(store)
    _pass(ledger, set(), time.time())
    head = store.head("broken")
    path = root / "manifests" / head
    path.write_bytes(path.read_bytes()[:-1] + b"\0")  # its head cannot be read
    for i in range(3, 6):
        _commit(store, "fine", 10 + i)
    expected = _full_pass(root, set(), time.time())
    result = _pass(ledger, set(), time.time())
    assert set(result.damaged) == {"broken"} and _files(root) == expected
    assert path.exists() and history.log(store, "fine")[0][1].version == 6


def _restarted(root: Path) -> Ledger:
    """A server's ledger after a restart, freeing at once all that no session holds (no grace):
    a live file it takes for unheld is gone, and `verify` says so."""
    return Ledger(Store(root, chunk=CHUNK), grace=0.0)


def test_a_restart_reads_again_only_the_sessions_written_since_the_ledger_was_saved(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root, chunk=CHUNK)
    for i in range(3):
        for session in ("a", "b", "c"):
            _commit(store, session, 10 * i + ord(session))
    now = time.time()
    ledger = Ledger(store)
    _pass(ledger, set(), now)  # its first pass saves the ledger
    _pass(ledger, set(), now)  # and reads again what the first one's frees wrote
    ledger.save()
    _commit(store, "a", 50)  # while no server runs; its change marks lost to a crash
    _commit(store, "d", 51)
    history.remove(store, "c")
    store.take_changed()
    ledger = _restarted(root)
    ledger.retain(POLICY, set(), now)
    assert ledger.pending == {"a", "c", "d"}  # b is taken as saved
    result = ledger.collect()
    assert result.removed > 0 and not history.verify(ledger.store).problems
    assert set(ledger.stamps) == {"a", "b", "d"}


@pytest.mark.parametrize("name", ["head", "index"])
def test_a_head_or_index_replaced_behind_the_ledgers_back_is_read_again(
        tmp_path: Path, name: str) -> None:
    """Replaced by a file of the same size and times, its change marks lost: its inode and
    change time still tell."""
    root = tmp_path / "store"
    store = _two_sessions(root, "a", "b")
    now = time.time()
    ledger = Ledger(store)
    _pass(ledger, set(), now)
    _pass(ledger, set(), now)  # and reads again what the first one's frees wrote
    ledger.save()
    path = root / "sessions" / "a" / name
    old = path.stat()
    data = f"{history.log(store, 'a')[1][0]}\n".encode() if name == "head" \
        else path.read_bytes()  # the head back at its parent
    replacement = path.with_name(".replacement")
    replacement.write_bytes(data)
    os.utime(replacement, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(replacement, path)
    assert path.stat().st_size == old.st_size and not store.take_changed()
    restarted = _restarted(root)
    restarted.retain(POLICY, set(), now)
    assert restarted.pending == {"a"}


def _state(ledger: Ledger) -> tuple[object, ...]:
    """What a ledger saves."""
    return (ledger.stamps, ledger.held, {s: (t.due, t.protected) for s, t in
                                          ledger.thinnings.items() if s in ledger.stamps},
            ledger.refs.packed(), ledger.damaged, ledger.unthinned, ledger.pending,
            ledger.unsettled, ledger.listed, ledger.kept, ledger.kept_bytes)


def _bystanders(store: Store, count: int = 12) -> set[str]:
    """Sessions of a commit each, that nothing changes: the whole ledger is then larger than a
    record of what one pass changed, as on any store but the smallest."""
    for i in range(count):
        _commit(store, f"x{i}", 100 + i)
    return {f"x{i}" for i in range(count)}


def test_saves_append_what_changed_and_load_as_the_ledger_that_made_them(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root, chunk=CHUNK)
    for session in ("a", "b", "c"):
        _commit(store, session, ord(session))
    _bystanders(store)
    ledger = Ledger(store)
    _pass(ledger, set(), time.time())  # saved whole
    saved = root / "ledger"
    whole = saved.read_bytes()
    _changes(store, 1)  # commits, a name, a new session, a removed one
    _pass(ledger, set(), time.time())
    ledger.save()
    assert saved.read_bytes().startswith(whole)  # appended, not written afresh
    assert _state(Ledger(Store(root, chunk=CHUNK))) == _state(ledger)


def test_appended_saves_past_the_whole_records_size_are_written_whole_again(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = _two_sessions(root, "a", "b")
    _bystanders(store)
    ledger = Ledger(store)
    _pass(ledger, set(), time.time())
    saved = root / "ledger"
    whole, inode = saved.stat().st_size, saved.stat().st_ino
    for i in range(50):
        _commit(store, "a", 10 + i)
        _pass(ledger, set(), time.time())
        ledger.save()
        if saved.stat().st_ino != inode:
            break
        assert saved.stat().st_size <= whole * 3 // 2
    assert i > 0 and saved.stat().st_ino != inode  # appended to, then written whole again
    assert _state(Ledger(Store(root, chunk=CHUNK))) == _state(ledger)


def _flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1:]


@pytest.mark.parametrize("damage", ["flipped", "torn", "stale", "not a ledger",
                                    "its last save cut short"])
def test_a_damaged_or_stale_ledger_is_not_trusted_and_no_live_chunk_is_freed(
        tmp_path: Path, damage: str) -> None:
    root = tmp_path / "store"
    store = _two_sessions(root, "a", "b")
    others = _bystanders(store)
    ledger = Ledger(store)
    _pass(ledger, set(), time.time())  # saved whole
    saved = root / "ledger"
    first, stamps = saved.read_bytes(), dict(ledger.stamps)
    for i in range(3, 6):  # a's versions move on and their old data is freed
        _commit(store, "a", i)
    _pass(ledger, set(), time.time())
    ledger.save()  # what changed, appended
    data = saved.read_bytes()
    assert data.startswith(first) and len(data) > len(first)
    saved.write_bytes({"flipped": _flipped(first) + data[len(first):], "torn": first[:-7],
                       "stale": first, "not a ledger": b"\0" * 64,
                       "its last save cut short": data[:-7]}[damage])
    _commit(store, "b", 20)  # its marks lost to a crash
    store.take_changed()
    restarted = _restarted(root)
    if damage in ("stale", "its last save cut short"):
        assert restarted.stamps == stamps  # as the save before left it
    else:
        assert not restarted.stamps  # nothing of it is trusted
    _pass(restarted, set(), time.time())
    assert not history.verify(restarted.store).problems
    assert set(Ledger(Store(root, chunk=CHUNK)).stamps) == {"a", "b", *others}  # saved afresh


def _forged(fields: dict[str, object], damage: str) -> None:
    """`fields` of a saved ledger, damaged as a writer that knows the format could."""
    held, counts = cast(list[bytes], fields["held"])
    if damage == "a bad name":
        cast(list[str], fields["sessions"])[0] = "../elsewhere"
    elif damage == "a column short":
        fields["held"] = [held, counts[:-4]]
    elif damage == "holds past their column":
        fields["held"] = [held[:-16], counts]
    elif damage == "a stamp short":
        fields["stamps"] = cast(list[int], fields["stamps"])[:-1]


@pytest.mark.parametrize("damage", ["none", "a bad name", "a column short",
                                    "holds past their column", "a stamp short"])
def test_a_ledger_forged_with_a_matching_digest_is_checked_field_by_field(
        tmp_path: Path, damage: str) -> None:
    root = tmp_path / "store"
    ledger = Ledger(_two_sessions(root, "a", "b"))
    _pass(ledger, set(), time.time())  # saved whole
    saved = root / "ledger"
    data = saved.read_bytes()
    magic, body = data[:len(ledger_magic)], data[len(ledger_magic) + 20:]  # one record
    fields = cast(dict[str, object], unpack(body))
    _forged(fields, damage)
    body = pack(fields)
    saved.write_bytes(magic + len(body).to_bytes(4, "little") + xxhash.xxh3_128_digest(body)
                      + body)
    assert set(_restarted(root).stamps) == (set() if damage != "none" else {"a", "b"})


def test_a_pass_whose_ledger_cannot_be_saved_still_frees_what_it_released(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root, chunk=CHUNK)
    for i in range(4):
        _commit(store, "a", i)
    (root / "ledger").mkdir()  # no file can take its place
    result = _pass(Ledger(store), set(), time.time())
    assert result.removed > 0 and not history.verify(store).problems

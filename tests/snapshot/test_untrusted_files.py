"""What a store finds in folders others can write (a user's part of a shared host's store):
a FIFO, a device, a link or a huge sparse file where a blob should be is refused unread, as a
missing or corrupt blob, and repair replaces it; a session whose head manifest or index is
damaged or gone is reported, and brought back from what is intact."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import commit_values

from fabric.errors import StoreError
from fabric.snapshot import Manifest, Store, catalog, history

ROOT = Path(__file__).resolve().parents[2]
CHUNK = 64 << 10


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: endless bytes


def _link(path: Path) -> None:
    secret = path.parent / "secret"
    secret.write_bytes(b"what the link's owner may not read")
    path.symlink_to(secret)


def _sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB of holes: no disk, but read whole it is 3 GiB of memory


PLANTED: dict[str, Callable[[Path], None]] = {
    "a FIFO": _fifo, "a character device": _device, "a symbolic link": _link,
    "huge": _sparse}


def _planted(store: Store, blob: str, kind: str) -> Path:
    path = store.disk.path(blob)
    path.unlink()
    PLANTED[kind](path)
    return path


@pytest.mark.parametrize("kind", PLANTED)
def test_a_blob_that_is_no_file_the_store_wrote_is_refused_unread(tmp_path: Path,
                                                                  kind: str) -> None:
    store = Store(tmp_path, chunk=CHUNK)
    data = catalog.encode({"names": {"x": {"type": "int"}}, "classes": {}})
    blob = store.put(data)
    path = _planted(store, blob, kind)
    fresh = Store(tmp_path, chunk=CHUNK)  # nothing in memory: the disk is read
    expected = "more than" if kind == "huge" else f"is {kind}"
    with pytest.raises(StoreError, match=expected) as refused:  # without blocking, or 3 GiB
        fresh.get(blob, catalog.LIMIT)
    assert refused.value.fields["blob"] == blob
    if kind != "huge":
        assert not fresh.has(blob)  # a commit naming it is refused: it is missing
        assert not fresh.is_object(blob)
    fresh.put(data)  # a save of the same bytes replaces it, without reading it
    assert stat.S_ISREG(os.lstat(path).st_mode) and Store(tmp_path).get(blob) == data


@pytest.mark.parametrize("kind", PLANTED)
def test_verify_names_a_planted_blob_and_repair_replaces_it(tmp_path: Path, kind: str) -> None:
    store = Store(tmp_path / "store", chunk=CHUNK)
    backup = Store(tmp_path / "backup", chunk=CHUNK)
    commit_values(store, "s", a=np.arange(50_000.0))
    blob = history.log(store, "s")[0][1].groups[0].blob
    chunk = store.object_chunks(blob)[0]
    backup.put(store.get(chunk))
    path = _planted(store, chunk, kind)
    store = Store(tmp_path / "store", chunk=CHUNK)

    problems = history.verify(store).problems  # streamed: no 3 GiB read, no wait on a FIFO
    why = "is corrupt (hash mismatch)" if kind == "huge" else f"is {kind}"
    assert any(chunk in p and why in p for p in problems), problems
    result = history.verify(store, repair=True, sources=[backup.disk])
    assert (result.repaired, result.problems) == ([chunk], [])
    assert stat.S_ISREG(os.lstat(path).st_mode) and store.disk.digest(chunk) == chunk
    assert len(store.get_object(blob).buffers[0]) == 400_000


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def _session(tmp_path: Path) -> tuple[Store, list[str]]:
    """Three versions of session s, tagged and with a retention policy of its own."""
    store = Store(tmp_path, chunk=CHUNK)
    heads = [commit_values(store, "s", a=np.arange(1000.0) * i) for i in range(3)]
    history.tag(store, "s", 2, "good")
    with store.locked("s"):
        index = store.index("s")
        index.policy = {"last": 1, "hourly": 0, "daily": 0}
        store.set_index("s", index)
    return store, heads


def test_a_corrupt_head_manifest_is_found_and_the_newest_intact_version_restored(
        tmp_path: Path) -> None:
    store, heads = _session(tmp_path)
    _damage(tmp_path / "manifests" / heads[-1])
    with pytest.raises(StoreError, match="corrupt"):
        history.log(store, "s")
    assert [m.version for _, m in history.intact(store, "s")] == [2, 1]

    found = history.verify(store)
    assert any(heads[-1] in p for p in found.problems) and not found.restored
    repaired = history.verify(store, repair=True)
    assert repaired.restored == [
        f"session s: its head could not be read (manifest {heads[-1]} is corrupt (hash "
        "mismatch)); it is back at version 2, the newest intact one: what a later version "
        f"held is lost (its damaged manifest is kept in {tmp_path / 'damaged'})"]
    assert (tmp_path / "damaged" / heads[-1]).is_file()
    assert history.verify(store).problems == []
    assert [m.version for _, m in history.log(store, "s")] == [2, 1]
    assert history.checkout(store, "s", 1).cell["checkout"] == 1  # the session goes on
    assert store.index("s").tags == {"good": heads[1]}


def test_a_corrupt_head_manifest_is_restored_from_the_remote_tier(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", chunk=CHUNK, remote=f"file://{tmp_path / 'remote'}")
    head = commit_values(store, "s", a=np.arange(1000.0))
    (tmp_path / "store" / "manifests" / head).write_bytes(b"garbage")
    assert history.verify(store, repair=True).restored == [
        f"session s: its head manifest {head} was restored from a good copy"]
    assert history.log(store, "s")[0][0] == head


def test_a_lost_index_is_reported_and_rebuilt_saying_what_was_lost(tmp_path: Path) -> None:
    store, heads = _session(tmp_path)
    # its own: the newest, and named
    history.retain(store, "s", history.retention.RetentionPolicy())
    history.gc(store, grace=0)  # version 1's data is freed: it is thinned
    (tmp_path / "sessions" / "s" / "index").unlink()

    assert any("has no index" in p for p in history.verify(store).problems)
    result = history.verify(store, repair=True)
    assert result.restored == [
        "session s: its index was missing and was rebuilt: 1 versions whose data is gone are "
        "marked thinned; names kept: none; any other names and its own retention policy are "
        "lost"]
    assert result.problems == []
    assert set(store.index("s").thinned) == {heads[0]}


def test_a_linked_head_manifest_is_refused(tmp_path: Path) -> None:
    store, heads = _session(tmp_path)
    manifest = tmp_path / "manifests" / heads[-1]
    elsewhere = tmp_path / "elsewhere"
    manifest.rename(elsewhere)
    manifest.symlink_to(elsewhere)
    with pytest.raises(StoreError, match="is a symbolic link"):
        history.log(store, "s")
    assert Manifest.decode(elsewhere.read_bytes()[len(b"LLFM\x01") + 32:]).version == 3


def _cli(store: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "store", *args, "--store",
                           str(store)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_store_log_lists_the_intact_versions_of_a_damaged_session(tmp_path: Path) -> None:
    _, heads = _session(tmp_path)
    _damage(tmp_path / "manifests" / heads[-1])
    shown = _cli(tmp_path, "log", "s")
    assert shown.returncode == 1
    assert "session s is damaged" in shown.stderr and "verify --repair" in shown.stderr
    assert [line.split()[0] for line in shown.stdout.splitlines()] == ["2", "1"]
    assert _cli(tmp_path, "verify", "--repair").returncode == 0
    assert _cli(tmp_path, "log", "s").returncode == 0


def test_an_overlong_session_name_is_a_clear_error(tmp_path: Path) -> None:
    Store(tmp_path)
    shown = _cli(tmp_path, "log", "x" * 10_000)
    assert shown.returncode == 1
    assert "Traceback" not in shown.stderr
    assert "invalid session name" in shown.stderr and "10000 characters" in shown.stderr


def test_a_planted_blob_the_remote_tier_holds_is_read_from_there_and_replaced(
        tmp_path: Path) -> None:
    remote = f"file://{tmp_path / 'remote'}"
    data = catalog.encode({"names": {"x": {"type": "int"}}, "classes": {}})
    blob = Store(tmp_path / "store", remote=remote).put(data)
    path = _planted(Store(tmp_path / "store"), blob, "a FIFO")
    assert Store(tmp_path / "store", remote=remote).get(blob, catalog.LIMIT) == data
    assert stat.S_ISREG(os.lstat(path).st_mode)

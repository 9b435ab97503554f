"""Crash safety: a saver killed at any point, or stopped by a full disk, loses nothing committed."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fabric.errors import DiskFull, StoreError
from fabric.snapshot import Group, Manifest, Store, dumps, history, loads
from fabric.snapshot.delta import DeltaSaver

ROOT = Path(__file__).resolve().parent.parent.parent

# Commits versions forever, as a worker and the server do together: objects, manifest, head.
SAVER = """
import sys
from pathlib import Path
import numpy as np
from fabric.snapshot import Group, Manifest, Store, dumps
store = Store(Path(sys.argv[1]), chunk=1 << 16)
head = store.head("s")
version = Manifest.decode(store.get_manifest(head)).version if head else 0
print("ready", flush=True)
while True:
    version += 1
    data = np.full(200_000, float(version))
    blob = store.put_object(dumps({"data": data, "version": version}, {}))
    group = Group(blob, ("data", "version"), 1)
    m = Manifest(session="s", version=version, parent=head, groups=(group,))
    store.set_head("s", store.put_manifest(m.encode()), head)
    head = store.head("s")
"""


def _check(store: Store) -> int:
    """The head loads, verifies and holds the state of its version; returns that version."""
    manifest = Manifest.decode(store.get_manifest(store.head("s")))
    values = loads(store.get_object(manifest.groups[0].blob), {})
    assert values["version"] == manifest.version
    assert np.all(values["data"] == manifest.version)
    assert not history.verify(store).problems
    return manifest.version


def test_kill_9_at_random_points_never_breaks_the_committed_head(tmp_path: Path) -> None:
    rng = random.Random(5)
    last = 0
    for _ in range(8):
        child = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        if Store(tmp_path).head("s") is not None:
            version = _check(Store(tmp_path))
            assert version >= last
            last = version
    assert last > 0


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 1 MiB tmpfs, so writes fail as on a full disk (ENOSPC)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_a_full_disk_gives_a_clear_error_and_keeps_the_last_version(small_disk: Path) -> None:
    store = Store(small_disk, chunk=1 << 16)
    blob = store.put_object(dumps({"data": np.ones(10), "version": 1}, {}))
    m = Manifest(session="s", version=1, groups=(Group(blob, ("data", "version"), 1),))
    store.set_head("s", store.put_manifest(m.encode()), None)
    before = _files(small_disk / "blobs")
    with pytest.raises(DiskFull, match="No space left on device"):
        store.put_object(dumps({"data": np.random.random(200_000), "version": 2}, {}))
    assert _check(Store(small_disk)) == 1
    # no half-written leftovers, and the chunks it did write are gone at once, not at gc
    assert _files(small_disk / "blobs") == before


def test_store_errors_name_the_bad_blob(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="missing"):
        Store(tmp_path).get_object("0" * 32)


def test_a_save_that_fills_the_disk_leaves_no_chunk_without_its_index(small_disk: Path) -> None:
    # Groups are written while the next is pickled: the one that does not fit fails the save,
    # and what is left on disk is whole objects only (gc frees those no version names).
    store = Store(small_disk, chunk=1 << 16)
    rng = np.random.default_rng(0)
    ns = {"a": rng.random(20_000), "b": rng.random(20_000), "c": rng.random(200_000)}
    with pytest.raises(DiskFull):
        DeltaSaver(store).save(ns, list(ns), None)
    indexes = [p.name for p in _files(small_disk / "blobs") if store.is_object(p.name)]
    named = {cid for ident in indexes for cid in store.object_chunks(ident)}
    assert {p.name for p in _files(small_disk / "blobs")} == set(indexes) | named


def test_a_group_whose_write_fails_is_unsaved_and_the_others_are_saved(tmp_path: Path) -> None:
    store = Store(tmp_path, chunk=1 << 16)
    rng = np.random.default_rng(1)
    ns = {"a": rng.random(20_000), "b": rng.random(20_000)}
    _, _, chunks = store.fingerprint(dumps({"b": ns["b"]}, ns))
    (store.disk.root / chunks[0][0][:2]).write_text("a file where its folder goes")
    saved = DeltaSaver(store).save(ns, list(ns), None)
    assert [names for _, names, _ in saved.groups] == [["a"]]
    assert list(saved.unsaved) == ["b"] and "Error" in saved.unsaved["b"]
    assert loads(store.get_object(saved.groups[0][0]), {})["a"].tolist() == ns["a"].tolist()

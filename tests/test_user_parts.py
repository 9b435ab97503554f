"""The store's layout on a host serving several users, and the mode's checks (the two-user
behaviour itself: tests/integration/test_users.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import commit_values

from fabric import users
from fabric.errors import ConfigError, Forbidden, UnsafePath
from fabric.snapshot.store import blob_id

ROOT = Path(__file__).resolve().parent.parent
UID, GID = 4242, 4243  # any ids: a part is made for a uid, whether or not it has a name


def _mode(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, stat.S_IMODE(st.st_mode)


def test_single_is_the_default_and_a_mode_is_checked() -> None:
    assert users.check_mode("single") is False
    with pytest.raises(ConfigError, match="users must be one of"):
        users.check_mode("shared")


def test_root_and_users_without_an_account_run_nothing(tmp_path: Path) -> None:
    with pytest.raises(Forbidden, match="no user code as root"):
        users.account("root", tmp_path)
    with pytest.raises(Forbidden, match="no OS account"):
        users.account("no-such-user-here", tmp_path)
    assert not (tmp_path / "users").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a part owned by another user needs root")
def test_a_users_part_is_theirs_alone_and_the_rest_is_passed_through(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    part = users.part(store, "alice", UID, GID)
    me = os.geteuid()
    assert [_mode(p) for p in (store, store / "users", part)] == [(me, 0o711)] * 3
    assert _mode(part / "blobs") == (UID, 0o700)
    assert users.part(store, "alice", UID, GID) == part  # checked, not remade
    (part / "blobs").chmod(0o755)  # she opened it: refused until she closes it again
    with pytest.raises(UnsafePath, match="lets other users in"):
        users.part(store, "alice", UID, GID)
    with pytest.raises(UnsafePath, match="belongs to uid"):  # someone else's folder
        users.part(store, "alice", UID + 1, GID)
    found = users.stores(users.Store(store))
    assert [s.root for s in found] == [store, part]
    assert len({s.key for s in found}) == 1  # one key signs every part


@pytest.mark.skipif(os.geteuid() != 0, reason="a part owned by another user needs root")
def test_what_the_server_stores_in_a_users_part_is_theirs_and_follows_no_link(
        tmp_path: Path) -> None:
    """The server writes a session's catalog into its user's blobs: the blob and any shard it
    makes are theirs (their workers write in that shard later), and a shard they swapped for a
    link is refused rather than followed."""
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    part = users.part(store, "alice", UID, GID)
    server = users.Store(part, key=users.Store(store).key, owner=(UID, GID))
    ident = server.put(b"a catalog")
    assert _mode(server.disk.path(ident)) == (UID, 0o600)
    assert _mode(server.disk.path(ident).parent) == (UID, 0o700)
    assert server.get(ident) == b"a catalog"
    data = next(d for d in (b"%d" % i for i in range(1000)) if blob_id(d)[:2] != ident[:2])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    server.disk.path(blob_id(data)).parent.symlink_to(elsewhere)
    with pytest.raises(OSError):
        server.put(data)
    assert not list(elsewhere.iterdir())


def test_store_verify_and_gc_cover_every_users_part(tmp_path: Path) -> None:
    """The admin's `llfabric store verify` and `gc` reach the users' parts, not only the root."""
    root = users.Store(tmp_path)
    part = users.Store(tmp_path / "users" / "alice", key=root.key)
    commit_values(part, "alice~s", x=1)
    orphan = part.put(b"saved, never committed")
    os.utime(part.disk.path(orphan), (0, 0))
    verified = _cli("store", "verify", "--store", str(tmp_path))
    assert verified.returncode == 0, verified.stderr
    assert f"{part.root}: 1 manifests" in verified.stdout
    (part.root / "manifests" / part.manifests()[0]).write_bytes(b"forged")
    assert _cli("store", "verify", "--store", str(tmp_path)).returncode == 1
    assert "removed 1 files" in _cli("store", "gc", "--store", str(tmp_path)).stdout
    assert not part.has(orphan)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)

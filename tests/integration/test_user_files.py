"""A shared host (`users = "separate"`) whose user put something other than a blob in their
part of the store: a FIFO, a device, a link, a huge sparse file where their catalogs were. The
server reads none of them as it would a blob: it stays responsive and small for every other
user, names the bad blob, and loses nothing committed."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
import threading
from pathlib import Path

import psutil
from helpers import execute
from test_users import _as, _cell, serving_users, two_users  # noqa: F401 (a fixture)

from fabric import users
from fabric.client import Client
from fabric.snapshot import Manifest, Store, history


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: endless bytes


def _link(path: Path) -> None:
    path.symlink_to("/etc/shadow")


def _huge(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB of holes


PLANTS = {"fifo": _fifo, "device": _device, "link": _link, "huge": _huge}


def _catalog_blob(store: Path, user: str, session: str) -> Path:
    part = Store(store / "users" / user, key=Store(store).key)
    manifest = Manifest.decode(part.get_manifest(part.head(f"{user}~{session}")))
    assert manifest.catalog is not None
    return part.disk.path(manifest.catalog)


def test_a_users_planted_files_hang_no_one_and_lose_nothing(two_users) -> None:  # noqa: F811
    store = Path(tempfile.mkdtemp(prefix="llf-store-", dir="/tmp"))
    try:
        check_planted_files(store, *two_users)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def check_planted_files(store: Path, alice: pwd.struct_passwd, bob: pwd.struct_passwd) -> None:
    """Alice commits a version of a session per plant; each session's catalog blob is replaced
    by its plant; a fresh server then serves her next cells and Bob's meanwhile, stays small,
    names each plant, and every commit is kept."""
    def first(client: Client) -> object:
        for i, session in enumerate(PLANTS):
            client.call("open", session=session)
            execute(client, session, f"x = {i}")
        return "ran"

    def second(client: Client) -> object:
        ran = {}
        for session in PLANTS:
            client.call("open", session=session)
            reply, _ = execute(client, session, "y = x + 1")
            ran[session] = [reply["status"], reply["version"]]
        return ran

    with serving_users(store) as running:
        assert _as(alice, running.address, first) == "ran"
    planted = {}
    for kind, plant in PLANTS.items():  # what her detached child could do (a device: root)
        planted[kind] = path = _catalog_blob(store, alice.pw_name, kind)
        path.unlink()
        plant(path)
        os.lchown(path, alice.pw_uid, alice.pw_gid)

    with serving_users(store) as running:  # a fresh server: no catalog in its memory
        hers: dict = {}
        thread = threading.Thread(
            target=lambda: hers.update(_as(alice, running.address, second)))
        thread.start()
        served = {"status": "ok", "text": "served\n"}
        assert _as(bob, running.address, _cell("his", "print('served')")) == served
        thread.join()
        assert hers == {kind: ["ok", 2] for kind in PLANTS}
        # with her blobs read on the server's loop, it waited on her FIFO for ever: her
        # client and then his gave up (after 60 s)
        assert _as(bob, running.address, _cell("his", "print('served')")) == served
        assert psutil.Process(running.process.pid).memory_info().rss < 1 << 30
        logged = running.log.read_text()
    for kind in ("a FIFO", "a character device", "a symbolic link"):
        assert f"is {kind}, not a file the store wrote" in logged
    assert "more than the" in logged  # the huge one, refused unread

    part = next(s for s in users.stores(Store(store)) if s.root.name == alice.pw_name)
    problems = history.verify(part).problems
    for kind, path in planted.items():
        assert any(path.name in p for p in problems), (kind, problems)
    for session in PLANTS:  # every commit kept: the catalogs lost only their descriptions
        assert [m.version for _, m in history.log(part, f"{alice.pw_name}~{session}")] \
            == [2, 1]

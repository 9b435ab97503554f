"""A remote filled behind the commits (`fabric.snapshot.behind`): its backlog is what this disk's
heads hold past the record of what was sent, and a pass sends it oldest first, the head last."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric.config import Config
from fabric.errors import ConfigError
from fabric.snapshot import Group, Manifest, Store
from fabric.snapshot.behind import Backlog
from fabric.snapshot.remote import Remote, RemoteTier


def _commit(store: Store, version: int, parent: str | None) -> tuple[str, str]:
    """A version of session "s" holding one blob: its manifest and blob."""
    blob = store.put(f"the state of version {version}".encode())
    ident = store.put_manifest(Manifest("s", version, parent, (Group(blob, ("x",), 24),)).encode())
    store.set_head("s", ident, parent)
    return ident, blob


def test_a_pass_sends_what_the_disk_holds_of_each_version_then_moves_the_head(
        tmp_path: Path) -> None:
    url = f"file://{tmp_path}/remote"
    store = Store(tmp_path / "here", remote=Remote(url, behind=True))
    backlog = Backlog.of(store)
    assert backlog is not None and not store.durable  # no commit waits for it
    versions, head = [], None
    for version in (1, 2, 3):
        head, blob = _commit(store, version, head)
        versions.append((head, blob))
    assert backlog.count() == {"s": 3}
    store.disk.remove(versions[1][1])  # retention thinned version 2
    assert backlog.send() == ""
    remote = RemoteTier(url)
    assert [remote.has(blob) for _, blob in versions] == [True, False, True]
    assert all(remote.manifest(ident) is not None for ident, _ in versions)
    assert remote.adopt("s") == head and backlog.count() == {}
    after, _ = _commit(store, 4, head)  # the next pass sends only what is new
    assert backlog.count() == {"s": 1} and backlog.send() == ""
    assert remote.adopt("s") == after and backlog.sent("s") == after


def test_a_host_takes_the_newer_of_its_head_and_the_remotes(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/remote"
    store = Store(tmp_path / "here", remote=Remote(url, behind=True))
    first, _ = _commit(store, 1, None)
    backlog = Backlog.of(store)
    assert backlog is not None and backlog.send() == ""
    second, _ = _commit(store, 2, first)  # not sent: the remote lags
    assert store.adopt_head("s") == second
    there = Store(tmp_path / "there", key=store.key, remote=Remote(url, behind=True))
    assert there.adopt_head("s") == first  # an empty disk: the remote's


def test_the_settings_say_when_a_commit_is_durable(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/remote"
    assert Config(remote=url).remote_tier == Remote(url, 60, behind=False)
    assert Config(remote=url, remote_writes="behind", remote_timeout=5).remote_tier == \
        Remote(url, 5, behind=True)
    assert Config(remote_writes="behind").remote_tier == ""  # no remote: this disk alone
    with pytest.raises(ConfigError, match="remote_writes is 'later'"):
        _ = Config(remote=url, remote_writes="later").remote_tier
    with pytest.raises(ConfigError, match="remote_timeout"):
        _ = Config(remote=url, remote_timeout=0).remote_tier

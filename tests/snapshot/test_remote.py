"""The remote tier (an fsspec URL): what one store replicates there, another store with an empty
disk (a host that never saw the session) fetches, checked; what the remote alters is refused."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from fabric.errors import ConfigError, StaleHead, StoreError
from fabric.snapshot import Manifest, Store, codec, history
from fabric.snapshot.remote import RemoteTier


@pytest.fixture(params=["file", "memory"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A shared folder, and fsspec's in-memory filesystem (a stand-in for an object store)."""
    if request.param == "file":
        return f"file://{tmp_path}/remote"
    return f"memory://llfabric-{uuid.uuid4().hex}"


def _two_hosts(tmp_path: Path, remote: str) -> tuple[Store, Store]:
    here = Store(tmp_path / "here", chunk=1 << 20, remote=remote)
    return here, Store(tmp_path / "there", key=here.key, remote=remote)  # the cluster's key


def test_an_object_replicated_here_is_fetched_there_with_its_chunks(tmp_path: Path,
                                                                  remote: str) -> None:
    here, there = _two_hosts(tmp_path, remote)
    worker = Store(tmp_path / "here", chunk=1 << 20, signs=False)  # a worker reaches no remote
    values = {"a": np.arange(1_000_000), "b": [1, "two"]}
    ident = worker.put_object(codec.dumps(values, {}))
    chunks = here.object_chunks(ident)
    assert len(chunks) > 1
    assert here.replicate([ident]) > 8_000_000
    assert here.replicate([ident]) == 0  # nothing twice
    assert not there.has(ident)
    assert there.fetch([ident]) > 8_000_000 and all(map(there.has, [ident, *chunks]))
    loaded = codec.loads(there.get_object(ident), {})
    assert loaded["b"] == [1, "two"] and np.array_equal(loaded["a"], values["a"])
    assert there.fetch([ident]) == 0


def test_a_blob_the_remote_altered_is_refused_and_not_kept(tmp_path: Path, remote: str) -> None:
    here, there = _two_hosts(tmp_path, remote)
    ident = here.put(b"the session's bytes")  # the server's own blobs go there at once
    here.tier(RemoteTier).write(ident, b"the session's bytez")
    with pytest.raises(StoreError, match="corrupt"):
        there.fetch([ident])
    assert not there.has(ident)
    with pytest.raises(StoreError, match="missing"):
        there.fetch(["0" * 32])


def test_heads_and_manifests_come_from_the_remote_checked_by_the_stores_key(
        tmp_path: Path, remote: str) -> None:
    here, there = _two_hosts(tmp_path, remote)
    manifest = here.put_manifest(b"a version")
    here.set_head("s", manifest, None)
    assert (there.sessions(), there.head("s")) == ([], manifest)  # its upkeep is here's
    assert there.get_manifest(manifest) == b"a version"
    assert (tmp_path / "there" / "manifests" / manifest).is_file()  # kept once checked
    stranger = Store(tmp_path / "stranger", remote=remote)  # another key
    with pytest.raises(StoreError, match="not signed"):
        stranger.get_manifest(manifest)
    assert there.remove_session("s") and here.tier(RemoteTier).get("sessions/s/head") is None


def test_two_hosts_that_commit_on_the_same_version_one_is_refused(tmp_path: Path,
                                                                   remote: str) -> None:
    """The remote head has one authority: each move claims its parent once."""
    here, there = _two_hosts(tmp_path, remote)
    first = here.put_manifest(b"version 1")
    here.set_head("s", first, None)
    assert there.adopt_head("s") == first
    mine, theirs = here.put_manifest(b"version 2, here"), there.put_manifest(b"version 2, there")
    here.set_head("s", mine, first)
    with pytest.raises(StaleHead, match="moved on from"):
        there.set_head("s", theirs, first)  # its own disk still says `first`
    assert (there.head("s"), there.adopt_head("s")) == (first, mine)  # nothing overwritten
    # a host lost between its claim and its head write: the claim is the head
    last = there.put_manifest(b"version 3")
    there.tier(RemoteTier).claim(f"sessions/s/after/{mine}", last.encode())
    assert here.adopt_head("s") == last
    # a session removed and made again starts afresh
    assert here.remove_session("s") and there.remove_session("s")
    again = here.put_manifest(b"a new version 1")
    here.set_head("s", again, None)
    assert there.adopt_head("s") == again


def test_a_name_given_to_a_version_on_one_host_is_known_on_the_next(tmp_path: Path,
                                                                      remote: str) -> None:
    here, there = _two_hosts(tmp_path, remote)
    first = here.put_manifest(Manifest("s", 1).encode())
    here.set_head("s", first, None)
    for name in ("best", ".."):  # any name a tag may have, even one no path may
        history.tag(here, "s", None, name)
    second = here.put_manifest(Manifest("s", 2, first).encode())
    here.set_head("s", second, first)
    history.tag(here, "s", None, "best")  # moved on
    assert there.adopt_head("s") == second
    assert there.index("s").tags == {"best": second, "..": first}
    assert history.tag(there, "s", "..", "again").version == 1


def test_a_remote_no_package_can_reach_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be used"):
        Store(tmp_path, remote="nosuchprotocol://bucket/path")


def test_a_blob_read_whole_comes_from_the_remote_where_this_disk_lacks_it(
        tmp_path: Path, remote: str) -> None:
    """A version's catalog, say, which no worker loads: its next commit on another host reads
    it (`Store.get`)."""
    here, there = _two_hosts(tmp_path, remote)
    ident = here.put(b"the names a version describes")
    assert not there.has(ident)
    assert there.get(ident) == b"the names a version describes" and there.has(ident)
    with pytest.raises(StoreError, match="missing"):
        there.get("0" * 32)

"""The peer tier: a host reads the blobs it lacks from the disk of another host, over a socket
only the cluster's peer key opens, each blob checked; what a peer lacks or alters comes from the
remote tier instead. Without a remote, peers keep each commit on `copies` hosts, and a host
takes the newest head they hold."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from fabric.auth import Keys
from fabric.cluster.peers import PEER, Peers, PeerServer, write_peers
from fabric.errors import StoreError
from fabric.snapshot import Group, Manifest, Store, codec
from fabric.snapshot.commit import spread
from fabric.snapshot.peers import PeerTier
from fabric.snapshot.remote import RemoteTier


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def peer_pair() -> tuple[str, str]:
    return tuple(k.decode() for k in zmq.curve_keypair())


def _serve(store: Store, name: str, pair: tuple[str, str]) -> tuple[PeerServer, dict]:
    """`store`'s blobs served to the cluster's peer key from a thread of its own; the entry
    naming it in a peers file."""
    keys = Keys(store.root.parent / f"{name}-keys")
    (keys.authorized).mkdir(parents=True)
    (keys.authorized / f"{PEER}.pub").write_text(pair[0] + "\n")
    address = f"tcp://127.0.0.1:{_port()}"
    server = PeerServer(store, address, keys)
    server.start()
    return server, {"name": name, "address": address, "server_key": keys.server_pair()[0]}


@pytest.fixture
def origin(tmp_path: Path, peer_pair: tuple[str, str]) -> Iterator[tuple[Store, dict]]:
    """A host's store serving its blobs to peers, from a thread of its own; and the entry
    that names it in a peers file."""
    store = Store(tmp_path / "origin", chunk=1 << 20, remote=f"file://{tmp_path}/remote")
    server, entry = _serve(store, "origin", peer_pair)
    yield store, entry
    server.stop()


def _host(tmp_path: Path, origin: Store, peers: list[dict], pair: tuple[str, str]) -> Store:
    """Another host, sharing the origin's remote and key, reading it as a peer."""
    path = tmp_path / "peers.json"
    write_peers(path, pair, peers)
    return Store(tmp_path / "other", key=origin.key, remote=origin.tier(RemoteTier).url,
                 peers=Peers(path))


def test_a_host_reads_what_it_lacks_from_a_peer_before_the_remote(
        tmp_path: Path, origin: tuple[Store, dict], peer_pair: tuple[str, str]) -> None:
    store, entry = origin
    worker = Store(tmp_path / "origin", chunk=1 << 20, signs=False)
    values = {"a": np.arange(600_000), "b": "two"}
    ident = worker.put_object(codec.dumps(values, {}))
    store.replicate([ident])
    other = _host(tmp_path, store, [entry], peer_pair)
    copied = other.fetch([ident])
    assert copied > 4_000_000
    assert other.sourced["peer"] == copied and other.sourced["remote"] == 0
    loaded = codec.loads(other.get_object(ident), {})
    assert loaded["b"] == "two" and np.array_equal(loaded["a"], values["a"])
    assert other.fetch([ident]) == 0  # on its disk now


def test_what_a_peer_lacks_or_alters_comes_from_the_remote(
        tmp_path: Path, origin: tuple[Store, dict], peer_pair: tuple[str, str]) -> None:
    store, entry = origin
    kept = store.put(b"on the origin's disk and the remote")
    altered = store.put(b"the origin's disk will lie about this one")
    store.disk.path(altered).write_bytes(b"the origin's disk will lie about this 0ne")
    elsewhere = store.put(b"only on the remote")
    store.disk.path(elsewhere).unlink()
    other = _host(tmp_path, store, [entry], peer_pair)
    other.fetch([kept, altered, elsewhere])
    assert other.get(kept) == b"on the origin's disk and the remote"
    assert other.get(altered) == b"the origin's disk will lie about this one"
    assert other.get(elsewhere) == b"only on the remote"
    assert other.sourced["remote"] > 0


def test_a_key_that_is_not_the_clusters_reads_nothing(
        tmp_path: Path, origin: tuple[Store, dict]) -> None:
    store, entry = origin
    ident = store.put(b"private")
    stranger = tuple(k.decode() for k in zmq.curve_keypair())
    other = _host(tmp_path, store, [entry], stranger)
    # refused: it waited, then gave up on the peer
    assert other.tier(PeerTier).locate([ident]) == {}
    other.fetch([ident])
    assert other.sourced == {"remote": len(b"private")}


def _commit(store: Store, session: str, values: dict, parent: str | None) -> tuple[str, str]:
    """A version of `session` holding `values` in one object, committed on `store`: its
    manifest and the object."""
    worker = Store(store.root, chunk=1 << 20, signs=False)
    ident = worker.put_object(codec.dumps(values, {}))
    version = 1 if parent is None else Manifest.decode(store.get_manifest(parent)).version + 1
    manifest = store.put_manifest(Manifest(session, version, parent, (
        Group(ident, tuple(values), 1),)).encode())
    store.set_head(session, manifest, parent)
    return manifest, ident


def test_without_a_remote_each_commit_is_kept_on_copies_hosts_and_the_newest_head_wins(
        tmp_path: Path, peer_pair: tuple[str, str]) -> None:
    names = ("a", "b", "c")
    stores = {n: Store(tmp_path / n, chunk=1 << 20, key=b"k" * 32, copies=2,
                       peers=Peers(tmp_path / f"{n}.peers")) for n in names}
    served = {n: _serve(stores[n], n, peer_pair) for n in names}
    for n in names:
        write_peers(tmp_path / f"{n}.peers", peer_pair, [e for m, (_, e) in served.items()
                                                         if m != n])
    try:
        a = stores["a"]
        first, _ = _commit(a, "s", {"x": np.arange(300_000)}, None)
        assert spread(a, "s", first).short == 0
        keeper = next(n for n in "bc" if stores[n].head("s") == first)  # one other host
        second, ident = _commit(a, "s", {"x": np.arange(400_000)}, first)
        assert spread(a, "s", second).short == 0
        assert stores[keeper].head("s") == second  # the same host keeps the session's next
        other = stores[next(n for n in "bc" if n != keeper)]
        assert other.head("s") is None
        served["a"][0].stop()  # the committing host is lost, and its peers are told
        for n in "bc":
            write_peers(tmp_path / f"{n}.peers", peer_pair,
                        [served[m][1] for m in "bc" if m != n])
        assert other.adopt_head("s") == second  # the newest any peer holds
        other.fetch([ident])
        assert np.array_equal(codec.loads(other.get_object(ident), {})["x"],
                              np.arange(400_000))
        with pytest.raises(StoreError, match="of session s, not t"):
            stores[keeper].keep("t", second)
        # more copies than hosts answer: it says how many short
        stores[keeper].tier(PeerTier).copies = 4
        third, _ = _commit(stores[keeper], "s", {"x": 3}, second)
        assert spread(stores[keeper], "s", third).short == 2
    finally:
        for n in "bc":
            served[n][0].stop()

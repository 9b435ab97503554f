"""The peer tier: a host reads the blobs it lacks from the disk of another host, over a socket
only the cluster's peer key opens, each blob checked; what a peer lacks or alters comes from the
remote tier instead."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from fabric.auth import Keys
from fabric.cluster.peers import PEER, Peers, PeerServer, write_peers
from fabric.snapshot import Store, codec


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def peer_pair() -> tuple[str, str]:
    return tuple(k.decode() for k in zmq.curve_keypair())


@pytest.fixture
def origin(tmp_path: Path, peer_pair: tuple[str, str]) -> Iterator[tuple[Store, dict]]:
    """A host's store serving its blobs to peers, from a thread of its own; and the entry
    that names it in a peers file."""
    store = Store(tmp_path / "origin", chunk=1 << 20, remote=f"file://{tmp_path}/remote")
    keys = Keys(tmp_path / "origin-keys")
    (keys.authorized).mkdir(parents=True)
    (keys.authorized / f"{PEER}.pub").write_text(peer_pair[0] + "\n")
    address = f"tcp://127.0.0.1:{_port()}"
    server = PeerServer(store.disk, address, keys)
    server.start()
    yield store, {"name": "origin", "address": address, "server_key": keys.server_pair()[0]}
    server.stop()


def _host(tmp_path: Path, origin: Store, peers: list[dict], pair: tuple[str, str]) -> Store:
    """Another host, sharing the origin's remote and key, reading it as a peer."""
    path = tmp_path / "peers.json"
    write_peers(path, pair, peers)
    return Store(tmp_path / "other", key=origin.key, remote=origin.remote.url,
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
    assert other.peers.locate([ident]) == {}  # refused: it waited, then gave up on the peer
    other.fetch([ident])
    assert other.sourced == {"remote": len(b"private")}

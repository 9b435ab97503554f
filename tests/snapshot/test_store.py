"""The content-addressed store and manifests, on real files."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from fabric.errors import StaleHead, StoreError
from fabric.snapshot import Group, Manifest, Store, blob_id


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_put_get_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path)
    ident = store.put(b"hello world")
    assert ident == blob_id(b"hello world")
    assert len(ident) == 32
    assert store.has(ident)
    assert store.get(ident) == b"hello world"
    # a fresh Store over the same root sees it: it is on disk
    assert Store(tmp_path).get(ident) == b"hello world"


def test_blobs_are_deduplicated(tmp_path: Path) -> None:
    store = Store(tmp_path)
    first = store.put(b"same bytes")
    path = tmp_path / "blobs" / first[:2] / first
    inode = path.stat().st_ino
    second = store.put(b"same bytes")
    assert first == second
    assert path.stat().st_ino == inode  # not rewritten (only touched, for gc's grace period)
    assert len(list((tmp_path / "blobs").rglob("*"))) == 2  # one shard dir, one blob
    assert store.put(b"other bytes") != first


def test_missing_blob_raises(tmp_path: Path) -> None:
    store = Store(tmp_path)
    ident = blob_id(b"never stored")
    assert not store.has(ident)
    with pytest.raises(StoreError, match="missing"):
        store.get(ident)


def test_corrupted_blob_raises_on_get(tmp_path: Path) -> None:
    store = Store(tmp_path)
    ident = store.put(b"precious pickled state")
    path = tmp_path / "blobs" / ident[:2] / ident
    path.write_bytes(b"precious pickled stat3")
    with pytest.raises(StoreError, match="corrupt") as info:
        Store(tmp_path).get(ident)  # a fresh process: this one's memory tier holds the good bytes
    assert info.value.fields["blob"] == ident


def test_truncated_blob_raises_on_get(tmp_path: Path) -> None:
    store = Store(tmp_path)
    ident = store.put(b"x" * 1000)
    path = tmp_path / "blobs" / ident[:2] / ident
    path.write_bytes(path.read_bytes()[:10])
    with pytest.raises(StoreError):
        Store(tmp_path).get(ident)


@pytest.mark.parametrize("bad", [
    "../etc/passwd",
    "../../../../../../etc/passwd",
    "abc",
    "a" * 31,
    "a" * 33,
    "A" * 32,
    "g" * 32,
    "",
    "0" * 30 + "/x",
])
def test_invalid_ids_are_refused(tmp_path: Path, bad: str) -> None:
    store = Store(tmp_path)
    with pytest.raises(StoreError, match="invalid"):
        store.get(bad)
    with pytest.raises(StoreError, match="invalid"):
        store.has(bad)
    with pytest.raises(StoreError, match="invalid"):
        store.get_manifest(bad)


def test_manifest_put_get_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path)
    manifest = Manifest(session="s", groups=(Group(store.put(b"g"), ("a",), 1),))
    ident = store.put_manifest(manifest.encode())
    assert Manifest.decode(store.get_manifest(ident)) == manifest
    assert store.put_manifest(manifest.encode()) == ident


def test_corrupted_manifest_raises(tmp_path: Path) -> None:
    store = Store(tmp_path)
    ident = store.put_manifest(Manifest(session="s").encode())
    (tmp_path / "manifests" / ident).write_bytes(b"\x80")
    with pytest.raises(StoreError, match="corrupt"):
        store.get_manifest(ident)


def test_missing_manifest_raises(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="missing"):
        Store(tmp_path).get_manifest("0" * 32)


def test_set_head_refuses_a_missing_manifest(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(StoreError, match="missing"):
        store.set_head("s", "0" * 32, None)
    assert store.head("s") is None
    assert store.sessions() == []


@pytest.mark.parametrize("bad", ["../blobs", "..", ".", "manifests/../../sessions"])
def test_set_head_refuses_an_invalid_manifest_id(tmp_path: Path, bad: str) -> None:
    # these paths exist on disk; a head must still never point at anything but a manifest id
    store = Store(tmp_path)
    with pytest.raises(StoreError):
        store.set_head("s", bad, None)
    assert store.head("s") is None


def test_heads_and_sessions(tmp_path: Path) -> None:
    store = Store(tmp_path)
    assert store.head("alpha") is None
    v0 = store.put_manifest(Manifest(session="alpha").encode())
    v1 = store.put_manifest(Manifest(session="alpha", version=1, parent=v0).encode())
    other = store.put_manifest(Manifest(session="beta").encode())
    store.set_head("beta", other, None)
    store.set_head("alpha", v0, None)
    assert store.head("alpha") == v0
    store.set_head("alpha", v1, v0)
    assert store.head("alpha") == v1
    assert store.head("beta") == other
    assert store.sessions() == ["alpha", "beta"]
    assert Store(tmp_path).head("alpha") == v1  # durable across instances


def test_a_head_moves_only_from_the_parent_its_manifest_was_built_on(tmp_path: Path) -> None:
    store = Store(tmp_path)
    v0 = store.put_manifest(Manifest(session="s").encode())
    store.set_head("s", v0, None)
    mine = store.put_manifest(Manifest(session="s", version=1, parent=v0, cell={"n": 1}).encode())
    theirs = store.put_manifest(Manifest(session="s", version=1, parent=v0, cell={"n": 2}).encode())
    store.set_head("s", theirs, v0)
    with pytest.raises(StaleHead) as err:  # built on v0 too, but the head has moved on
        store.set_head("s", mine, v0)
    assert err.value.kind == "stale" and err.value.fields["head"] == theirs
    assert store.head("s") == theirs
    with pytest.raises(StaleHead):  # a first version, where one exists already
        store.set_head("s", mine, None)
    assert store.head("s") == theirs


def test_sessions_ignores_directories_without_a_head(tmp_path: Path) -> None:
    store = Store(tmp_path)
    (tmp_path / "sessions" / "half-made").mkdir()
    assert store.sessions() == []


def test_corrupt_head_raises(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.set_head("s", store.put_manifest(Manifest(session="s").encode()), None)
    (tmp_path / "sessions" / "s" / "head").write_text("../../etc/passwd\n")
    with pytest.raises(StoreError, match="corrupt head"):
        store.head("s")


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden"])
def test_invalid_session_names_are_refused(tmp_path: Path, bad: str) -> None:
    store = Store(tmp_path)
    ident = store.put_manifest(Manifest(session="s").encode())
    with pytest.raises(StoreError, match="invalid session"):
        store.set_head(bad, ident, None)
    with pytest.raises(StoreError, match="invalid session"):
        store.head(bad)


def test_no_temp_files_are_left_after_writes(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for i in range(20):
        store.put(f"blob {i}".encode())
    ident = store.put_manifest(Manifest(session="s").encode())
    store.set_head("s", ident, None)
    store.set_head("s", ident, ident)
    files = _files(tmp_path)
    assert files  # something was written
    assert not [p for p in files if p.name.startswith(".tmp-")]
    # blobs, manifest, head, index, lock, key, the session's mark for upkeep
    assert len(files) == 20 + 1 + 1 + 1 + 1 + 1 + 1


def test_manifest_encode_decode_round_trip() -> None:
    manifest = Manifest(
        session="nb-1",
        version=7,
        parent="1" * 32,
        groups=(Group("a" * 32, ("x", "y"), 123), Group("b" * 32, ("f",), 0, device=True)),
        imports={"np": "numpy", "plt": "matplotlib.pyplot"},
        refs={"f": ("K", "np")},
        ambient="c" * 32,
        modules=("numpy", "matplotlib.pyplot"),
        cell={"execution_count": 3, "status": "ok"},
    )
    decoded = Manifest.decode(manifest.encode())
    assert decoded == manifest
    assert decoded.variables() == {"x": manifest.groups[0], "y": manifest.groups[0],
                                   "f": manifest.groups[1]}
    assert decoded.names() == {"x", "y", "f", "np", "plt"}


def test_a_manifest_from_before_device_groups_decodes_with_none_holding_cuda() -> None:
    decoded = Manifest.decode(_raw(groups=[["a" * 32, ["x"], 1]]))
    assert decoded.groups == (Group("a" * 32, ("x",), 1, device=False),)


def test_empty_manifest_round_trip() -> None:
    manifest = Manifest(session="s")
    assert Manifest.decode(manifest.encode()) == manifest


def _raw(**changes: object) -> bytes:
    raw = msgpack.unpackb(Manifest(session="s", groups=(Group("a" * 32, ("x",), 1),)).encode())
    raw.update(changes)
    return msgpack.packb(raw, use_bin_type=True)


@pytest.mark.parametrize("data", [
    b"",
    b"\xc1",  # a byte msgpack never uses
    b"not msgpack at all \xff\xfe",
    b"\x92\x01",  # truncated
    msgpack.packb([1, 2, 3]),
    msgpack.packb("a string"),
    msgpack.packb({"format": 1}),  # fields missing
], ids=["empty", "reserved-byte", "garbage", "truncated", "list", "string", "missing-fields"])
def test_decode_garbage_raises(data: bytes) -> None:
    with pytest.raises(StoreError, match="malformed"):
        Manifest.decode(data)


@pytest.mark.parametrize("changes", [
    {"format": 2},
    {"format": None},
], ids=["future-format", "no-format"])
def test_decode_wrong_format_raises(changes: dict) -> None:
    with pytest.raises(StoreError, match="malformed"):
        Manifest.decode(_raw(**changes))


@pytest.mark.parametrize("changes", [
    {"session": 5},
    {"version": "seven"},
    {"version": None},
    {"parent": 12},
    {"groups": "abc"},
    {"groups": {"a": 1}},
    {"modules": "numpy"},
    {"groups": [["a" * 32, ["x"]]]},  # size missing
    {"groups": [[123, ["x"], 1]]},  # blob not a string
    {"groups": [["a" * 32, [1], 1]]},  # name not a string
    {"groups": [["a" * 32, "xy", 1]]},  # names a string, not a list
    {"groups": [["a" * 32, ["x"], "big"]]},
    {"groups": [["a" * 32, ["x"], 1, "yes"]]},  # device not a boolean
    {"groups": [["a" * 32, ["x"], 1, True, 0]]},
    {"imports": ["np"]},
    {"imports": {"np": 1}},
    {"refs": {"f": [1]}},
    {"refs": {"f": "K"}},  # a string, not a list of names
    {"ambient": 3},
    {"modules": [None]},
    {"cell": 5},
], ids=lambda c: next(iter(c)) + "=" + repr(next(iter(c.values())))[:20])
def test_decode_wrong_field_types_raise(changes: dict) -> None:
    with pytest.raises(StoreError, match="malformed"):
        Manifest.decode(_raw(**changes))


def test_a_view_that_does_not_sign_never_reads_the_key(tmp_path) -> None:
    """A worker's view of the store: blobs only; user code could read a key from its memory."""
    Store(tmp_path)  # the server's, which makes the key
    (tmp_path / "key").unlink()
    view = Store(tmp_path, signs=False)
    assert not (tmp_path / "key").exists()  # not made either
    assert view.get(view.put(b"blob")) == b"blob"
    with pytest.raises(StoreError, match="only the server signs"):
        view.put_manifest(b"forged")

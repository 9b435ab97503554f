"""A pinned worker's image carried between hosts' stores: laid out again byte for byte on the
other host, kept off the remote tier unless asked, and its map checked like any input.

(The whole move, a real worker dumped on one host and restored on another, runs on a Ray
cluster in `tests/cluster/test_cluster.py`.)"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from fabric.errors import ProtocolError, StoreError
from fabric.pool.lifecycle import CoolImage, Life
from fabric.pool.migration import Carried, pack, unpack
from fabric.snapshot import Store
from fabric.snapshot.remote import RemoteTier


def _image(root: Path) -> CoolImage:
    """A folder shaped like a CRIU dump: page files of several pieces, an empty file, and the
    mapped files' folder."""
    (root / "mapped").mkdir(parents=True)
    (root / "pages-1.img").write_bytes(os.urandom(5000))
    (root / "core-7.img").write_bytes(b"core" * 100)
    (root / "empty.img").write_bytes(b"")
    (root / "mapped" / "0").write_bytes(os.urandom(3000))
    (root / "mapped" / "paths.json").write_text('{"0": "/srv/store/blobs/ab/cd"}')
    return CoolImage(root, init=False, parked=True, device="GPU-a")


def _life(base: str) -> Life:
    async def make() -> Life:  # a Life belongs to a loop
        return Life.after_cell(None, None, base, {"numbers", "first"}, ["numbers"])
    return asyncio.run(make())


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file()}


def test_an_image_is_laid_out_again_on_another_host_byte_for_byte(tmp_path: Path) -> None:
    remote = f"file://{tmp_path}/remote"
    here = Store(tmp_path / "here", chunk=1024, remote=remote)
    there = Store(tmp_path / "there", key=here.key, remote=remote)
    image = _image(tmp_path / "dump")
    carried = pack(here, image, _life("h" * 32))
    blobs = [b for _, pieces in carried.files for b in pieces]
    assert len(dict(carried.files)["pages-1.img"]) == 5  # cut in chunk-sized pieces
    assert not any(here.tier(RemoteTier).has(b) for b in blobs)  # off the remote tier
    here.replicate(blobs)  # what the peer tier does between hosts, here through the remote
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    restored = unpack(there, Carried.from_wire(carried.to_wire()), arrived)
    assert _files(arrived) == _files(image.images)
    assert (restored.parked, restored.device, restored.init) == (True, "GPU-a", False)
    assert (carried.base, carried.holds, carried.unsaved) == ("h" * 32, ["first", "numbers"],
                                                              ["numbers"])


def test_a_piece_no_tier_has_fails_the_unpack_and_leaves_no_folder(tmp_path: Path) -> None:
    here = Store(tmp_path / "here", chunk=1024)
    carried = pack(here, _image(tmp_path / "dump"), _life("h" * 32))
    there = Store(tmp_path / "there", key=here.key)  # no peer, no remote: nothing to fetch from
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    with pytest.raises(StoreError, match="missing"):
        unpack(there, carried, arrived)
    assert not arrived.exists()


GOOD = {"files": [["pages-1.img", ["a" * 32]], ["mapped/0", []]], "init": False,
        "parked": False, "device": None, "base": "b" * 32, "holds": ["x"], "unsaved": ["x"]}


@pytest.mark.parametrize("change, why", [
    ({"files": [["/etc/passwd", ["a" * 32]]]}, "inside the image"),
    ({"files": [["../../outside", ["a" * 32]]]}, "inside the image"),
    ({"files": [["mapped/../../x", ["a" * 32]]]}, "inside the image"),
    ({"files": [["", ["a" * 32]]]}, "inside the image"),
    ({"files": [["pages-1.img", ["../x"]]]}, "blob id"),
    ({"files": [["pages-1.img", "a" * 32]]}, "blob id"),
    ({"files": {"pages-1.img": ["a" * 32]}}, "blob id"),
    ({"init": "yes"}, "booleans"),
    ({"device": 3}, "booleans"),
    ({"holds": "x"}, "booleans"),
    ({"unsaved": [1]}, "booleans"),
    ({"extra": 1}, "a map of"),
])
def test_a_carried_map_that_is_not_well_formed_is_refused(change: dict, why: str) -> None:
    assert Carried.from_wire(GOOD).files[0] == ("pages-1.img", ["a" * 32])
    with pytest.raises(ProtocolError, match=why):
        Carried.from_wire({**GOOD, **change})
    with pytest.raises(ProtocolError, match="a map of"):
        Carried.from_wire({k: v for k, v in GOOD.items() if k != "base"})

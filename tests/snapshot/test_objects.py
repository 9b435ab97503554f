"""Groups stored as objects: out-of-band buffers in chunks, dedup, verification, signatures."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse
import torch

from fabric.errors import StoreError
from fabric.snapshot import Manifest, Store, blob_id, dumps, loads
from fabric.snapshot.tiers import MemoryTier

CHUNK = 1 << 16  # small chunks keep these tests fast and still cut buffers in several


def _store(root: Path) -> Store:
    return Store(root, chunk=CHUNK)


def _blobs(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in (root / "blobs").rglob("*") if p.is_file()}


def _round_trip(root: Path, values: dict) -> dict:
    store = _store(root)
    ident = store.put_object(dumps(values, {}))
    return loads(_store(root).get_object(ident), {})  # a fresh process: nothing cached


def test_array_memory_is_out_of_band_and_chunked(tmp_path: Path) -> None:
    big = np.arange(100_000, dtype=np.float64)  # 800 kB: 13 chunks
    encoded = dumps({"big": big}, {})
    assert len(encoded.stream) < 1000  # the stream holds no array bytes
    assert sum(b.nbytes for b in encoded.buffers) == big.nbytes
    back = _round_trip(tmp_path, {"big": big})
    np.testing.assert_array_equal(back["big"], big)
    assert back["big"].flags.writeable
    assert len(_blobs(tmp_path)) == -(-big.nbytes // CHUNK) + 1  # chunks and the index


def test_torch_types_round_trip_with_storage_sharing(tmp_path: Path) -> None:
    base = torch.randn(300, 200).to(torch.bfloat16)
    model = torch.nn.Linear(200, 300)
    model.weight.grad = torch.ones_like(model.weight)
    values = {"base": base, "view": base[::2, 1::3], "t": base.t(), "model": model,
              "frozen": torch.nn.Parameter(torch.zeros(3), requires_grad=False),
              "leaf": torch.ones(70_000, requires_grad=True)}
    back = _round_trip(tmp_path, values)
    assert back["base"].dtype == torch.bfloat16 and torch.equal(back["base"], base)
    assert torch.equal(back["view"], values["view"]) and not back["view"].is_contiguous()
    ptrs = {back[n].untyped_storage().data_ptr() for n in ("base", "view", "t")}
    assert len(ptrs) == 1
    back["base"][0, 1] = 42
    assert back["view"][0, 0] == 42 and back["t"][1, 0] == 42
    assert torch.equal(back["model"].weight, model.weight)
    assert torch.equal(back["model"].weight.grad, model.weight.grad)
    assert isinstance(back["frozen"], torch.nn.Parameter) and not back["frozen"].requires_grad
    assert back["leaf"].requires_grad and back["leaf"].is_leaf


def test_pandas_and_scipy_sparse_round_trip_through_their_buffers(tmp_path: Path) -> None:
    frame = pd.DataFrame({"a": np.arange(20_000), "b": np.linspace(0, 1, 20_000),
                          "c": ["x", "y"] * 10_000})
    sparse = scipy.sparse.random(2000, 2000, density=0.01, format="csr", random_state=0)
    encoded = dumps({"frame": frame, "sparse": sparse}, {})
    assert len(encoded.stream) < frame["c"].memory_usage(deep=True)  # numbers out of band
    back = _round_trip(tmp_path, {"frame": frame, "sparse": sparse})
    pd.testing.assert_frame_equal(back["frame"], frame)
    assert (back["sparse"] != sparse).nnz == 0


def test_a_changed_part_rewrites_only_its_chunks(tmp_path: Path) -> None:
    store = _store(tmp_path)
    data = np.zeros(10 * CHUNK // 8)
    data[:] = np.arange(data.size)
    first = store.put_object(dumps({"d": data}, {}))
    before = _blobs(tmp_path)
    data[5] = -1  # inside the first chunk
    second = store.put_object(dumps({"d": data}, {}))
    after = _blobs(tmp_path)
    assert second != first
    assert set(after) - set(before) == {second, blob_id(data.view("u1")[:CHUNK])}


def test_an_unchanged_group_is_not_written_at_all(tmp_path: Path) -> None:
    store = _store(tmp_path)
    values = {"d": np.arange(50_000.0)}
    ident = store.put_object(dumps(values, {}))
    before = _blobs(tmp_path)
    assert store.put_object(dumps(values, {}), known=ident) == ident
    assert _blobs(tmp_path) == before  # same files, not rewritten


def test_dedup_across_groups(tmp_path: Path) -> None:
    store = _store(tmp_path)
    shared = np.arange(40_000.0)
    store.put_object(dumps({"a": shared}, {}))
    count = len(_blobs(tmp_path))
    store.put_object(dumps({"b": shared.copy(), "n": 1}, {}))
    assert len(_blobs(tmp_path)) == count + 1  # only the new index


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


class Boom:
    """Unpickling this runs code: it must never happen for bytes the store did not write."""

    ran = False

    def __reduce__(self) -> tuple:
        return Boom._run, ()

    @staticmethod
    def _run() -> Boom:
        Boom.ran = True
        return Boom()


@pytest.mark.parametrize("target", ["chunk", "index"])
def test_a_flipped_byte_is_refused_before_unpickling(tmp_path: Path, target: str) -> None:
    store = _store(tmp_path)
    ident = store.put_object(dumps({"boom": Boom(), "d": np.arange(30_000.0)}, {}))
    victim = store.object_chunks(ident)[1] if target == "chunk" else ident
    _flip(store.disk.path(victim), 7)
    Boom.ran = False
    with pytest.raises(StoreError, match="corrupt") as info:
        loads(_store(tmp_path).get_object(ident), {})
    assert info.value.fields["blob"] == victim
    assert not Boom.ran


def test_manifest_signatures(tmp_path: Path) -> None:
    store = _store(tmp_path)
    body = Manifest(session="s", version=3).encode()
    ident = store.put_manifest(body)
    assert store.get_manifest(ident) == body
    path = tmp_path / "manifests" / ident
    # tampered and renamed to its new hash, as one who knows the layout but not the key would
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    forged = blob_id(bytes(data))
    (tmp_path / "manifests" / forged).write_bytes(bytes(data))
    with pytest.raises(StoreError, match="not signed"):
        store.get_manifest(forged)
    unsigned = blob_id(body)
    (tmp_path / "manifests" / unsigned).write_bytes(body)
    with pytest.raises(StoreError, match="not signed"):
        store.get_manifest(unsigned)
    # another store's key does not sign for this one
    other = _store(tmp_path / "other")
    theirs = other.put_manifest(body)
    (tmp_path / "manifests" / theirs).write_bytes((other.root / "manifests" / theirs).read_bytes())
    with pytest.raises(StoreError, match="not signed"):
        store.get_manifest(theirs)
    key = (tmp_path / "key").read_bytes()
    assert len(key) == 32 and key != hashlib.sha256(b"").digest()
    assert (tmp_path / "key").stat().st_mode & 0o077 == 0


def test_memory_tier_serves_reads_and_stays_bounded(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ident = store.put_object(dumps({"d": np.arange(30_000.0)}, {}))
    store.get_object(ident)  # fills the cache
    for path in (tmp_path / "blobs").rglob("*"):
        if path.is_file():
            path.unlink()
    np.testing.assert_array_equal(loads(store.get_object(ident), {})["d"], np.arange(30_000.0))
    assert not store.has(ident)  # a commit may only name what the disk holds
    tier = MemoryTier(capacity=1000)
    for i in range(10):
        tier.write(f"{i:032x}", bytes(200))
    assert tier.used <= 1000 and tier.has(f"{9:032x}") and not tier.has(f"{0:032x}")


def test_a_group_of_host_tensors_and_arrays_holds_no_cuda_memory() -> None:
    values = {"t": torch.ones(3), "m": torch.nn.Linear(2, 2), "a": np.ones(3)}
    assert not dumps(values, {}).device  # a GPU host loads it ahead of the lease


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (CPU build of torch)")
def test_cuda_tensors_come_back_on_their_device_sharing_storage(tmp_path: Path) -> None:
    device = torch.cuda.device_count() - 1
    base = torch.randn(1000, 300, device=f"cuda:{device}").to(torch.bfloat16)
    values = {"base": base, "view": base[:, ::3], "param": torch.nn.Parameter(base[0].clone())}
    back = _round_trip(tmp_path, values)
    assert back["base"].device == base.device and back["base"].dtype == torch.bfloat16
    assert torch.equal(back["view"], values["view"])
    assert back["view"].untyped_storage().data_ptr() == back["base"].untyped_storage().data_ptr()
    assert back["param"].requires_grad and back["param"].device == base.device
    assert dumps(values, {}).device  # its group loads only under a lease (`SessionWorkers`)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (CPU build of torch)")
def test_a_cuda_tensor_larger_than_a_staging_piece_comes_back_whole(tmp_path: Path) -> None:
    from fabric.snapshot.staging import PIECE

    # three pieces and a ragged end, so each staging buffer is reused and the last is partial
    size = 3 * PIECE + 4099
    big = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda")
    back = _round_trip(tmp_path, {"big": big[1:]})["big"]
    assert back.device == big.device and torch.equal(back, big[1:])

"""Saves that hash only what was written: every way of writing a buffer is seen, and a buffer
nothing wrote is neither hashed nor written."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fabric.snapshot import Store, loads, written
from fabric.snapshot.delta import DeltaSaver, Saved

CHUNK = 1 << 20
SIZE = 8 * CHUNK  # bytes of each buffer: 8 chunks

pytestmark = pytest.mark.skipif(written.tracker() is None,
                                reason=f"this kernel does not track writes: {written.why()}")


class _Cells:
    """A namespace saved after each change, as a worker saves after each cell."""

    def __init__(self, root: Path, track: bool = True) -> None:
        self.store = Store(root, chunk=CHUNK)
        self.saver = DeltaSaver(self.store, track=track)
        self.ns: dict[str, Any] = {"__name__": "__main__"}

    def save(self) -> Saved:
        return self.saver.save(self.ns, [n for n in self.ns if not n.startswith("__")], None)

    def saved(self, saved: Saved, name: str) -> Any:
        blob = next(b for b, names, _ in saved.groups if name in names)
        return loads(Store(self.store.root, chunk=CHUNK).get_object(blob), {})[name]


def _middle(nbytes: int) -> int:
    return nbytes // 2 + 12345  # a byte inside a page inside a chunk: not on any boundary


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _own_pages(fill: int = 0) -> np.ndarray:
    """A buffer on pages of its own: one from the heap shares its edge pages with what malloc
    writes there, so its edge chunks are hashed again now and then."""
    memory = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    array = np.frombuffer(memory, dtype=np.uint8)
    array[:] = fill
    return array


def test_a_buffer_nothing_wrote_is_neither_hashed_nor_written(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    cells.ns["x"] = _own_pages()
    cells.ns["x"][:] = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8)
    first = cells.save()
    assert (first.hashed, first.reused) == (SIZE, 0)
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    float(cells.ns["x"].sum())  # read, as a cell that reads it does
    again = cells.save()
    assert (again.hashed, again.reused) == (0, SIZE)
    assert again.groups == first.groups
    assert {p for p in tmp_path.rglob("*") if p.is_file()} == files.keys()  # nothing new


WRITES: dict[str, Callable[[np.ndarray], None]] = {
    "numpy item": lambda x: x.__setitem__(_middle(x.size), 7),
    "numpy in place": lambda x: np.add(x, 1, out=x),
    "numpy ufunc out= a slice": lambda x: np.negative(x[:100], out=x[:100]),
    "torch in place": lambda x: torch.from_numpy(x).mul_(3),
    "torch slice": lambda x: torch.from_numpy(x)[_middle(x.size)].fill_(9),
    "C memmove": lambda x: ctypes.memmove(_address(x) + _middle(x.size), b"\x05", 1),
    "memoryview": lambda x: memoryview(x).cast("B").__setitem__(_middle(x.size), 3),
    "a kernel read(2) into it": lambda x: _read_into(x),
}


def _read_into(x: np.ndarray) -> None:
    with open("/dev/urandom", "rb", buffering=0) as f:
        f.readinto(memoryview(x)[_middle(x.size) - 10:_middle(x.size)])


@pytest.mark.parametrize("how", WRITES)
def test_a_write_through_any_path_is_seen(tmp_path: Path, how: str) -> None:
    cells = _Cells(tmp_path)
    cells.ns["x"] = np.arange(SIZE, dtype=np.uint8)
    cells.save()
    WRITES[how](cells.ns["x"])
    expected = cells.ns["x"].copy()
    saved = cells.save()
    assert saved.hashed > 0
    assert np.array_equal(cells.saved(saved, "x"), expected)


def test_one_byte_written_costs_one_chunk(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    cells.ns["t"] = torch.from_numpy(_own_pages())
    cells.save()
    cells.ns["t"][_middle(SIZE)] = 1
    saved = cells.save()
    assert (saved.hashed, saved.reused) == (CHUNK, SIZE - CHUNK)
    assert int(cells.saved(saved, "t").sum()) == 1


def test_a_buffer_written_every_cell_is_saved_each_time(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    cells.ns["x"] = np.zeros(SIZE, dtype=np.uint8)
    for step in range(1, 5):  # its chunks are left unprotected once they change: still seen
        cells.ns["x"][::4096] = step
        saved = cells.save()
        assert set(np.unique(cells.saved(saved, "x")[::4096])) == {step}


def test_untracked_saves_hash_everything(tmp_path: Path) -> None:
    cells = _Cells(tmp_path, track=False)
    cells.ns["x"] = np.ones(SIZE, dtype=np.uint8)
    cells.save()
    again = cells.save()
    assert (again.hashed, again.reused) == (SIZE, 0)


def test_memory_another_process_can_write_is_always_hashed(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    shared = mmap.mmap(-1, SIZE)  # MAP_SHARED: a child's writes are ours
    cells.ns["x"] = np.frombuffer(shared, dtype=np.uint8)
    cells.save()
    pid = os.fork()
    if pid == 0:
        shared[_middle(SIZE)] = 42
        os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    saved = cells.save()
    assert saved.reused == 0
    assert cells.saved(saved, "x")[_middle(SIZE)] == 42


def test_pages_released_by_madvise_are_seen(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    memory = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    cells.ns["x"] = np.frombuffer(memory, dtype=np.uint8)
    cells.ns["x"][:] = 1
    cells.save()
    memory.madvise(mmap.MADV_DONTNEED, 0, SIZE)  # private anonymous pages read as zeros again
    saved = cells.save()
    assert saved.hashed == SIZE and not cells.saved(saved, "x").any()


def test_a_loaded_buffer_is_tracked_and_its_writes_seen(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    cells.ns["x"] = np.full(SIZE, 2, dtype=np.uint8)
    blob = next(b for b, _, _ in cells.save().groups)
    loaded = _Cells(tmp_path)  # a fresh worker: the store maps the chunk files in
    encoded = loaded.store.get_object(blob)
    loaded.saver.seed(blob, encoded)  # verified as it was read: its ids are known
    loaded.ns["x"] = loads(encoded, {})["x"]
    loaded.saver.loaded(["x"], blob, SIZE)
    assert loaded.save().reused == SIZE
    loaded.ns["x"][_middle(SIZE)] = 0  # copies that page from the file's
    saved = loaded.save()
    assert saved.hashed == CHUNK
    assert loaded.saved(saved, "x")[_middle(SIZE)] == 0


def test_after_a_reset_everything_is_hashed_again(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    cells.ns["x"] = np.ones(SIZE, dtype=np.uint8)
    cells.save()
    written.reset()  # as before a dump: the restored copy's pages are unprotected
    assert cells.save().hashed == SIZE


def test_a_forked_child_tracks_on_its_own(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    cells.ns["x"] = _own_pages(1)
    cells.save()
    pid = os.fork()
    if pid == 0:  # its pages are its own copies, unprotected: it must hash them
        try:
            cells.ns["x"][_middle(SIZE)] = 5
            saved = cells.save()
            ok = saved.hashed == SIZE and cells.saved(saved, "x")[_middle(SIZE)] == 5
            ok = ok and cells.save().reused == SIZE
        finally:
            os._exit(0 if ok else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert cells.save().reused == SIZE  # the child's protections did not touch ours
    cells.ns["x"][_middle(SIZE)] = 6
    saved = cells.save()
    assert saved.hashed == CHUNK and cells.saved(saved, "x")[_middle(SIZE)] == 6


def test_buffers_sharing_a_page_each_see_its_writes(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    base = np.zeros(2 * SIZE + 4096, dtype=np.uint8)
    # two blocks on one memory, their ranges meeting inside a page: two buffers to the save
    cells.ns["a"] = np.frombuffer(memoryview(base)[:SIZE + 100], dtype=np.uint8)
    cells.ns["b"] = np.frombuffer(memoryview(base)[SIZE + 100:], dtype=np.uint8)
    cells.save()
    base[SIZE + 50] = 1  # in a, on the page b starts on
    saved = cells.save()
    assert cells.saved(saved, "a")[SIZE + 50] == 1
    base[SIZE + 150] = 2  # now in b, on the same page
    saved = cells.save()
    assert cells.saved(saved, "b")[50] == 2


def _between_others() -> tuple[np.ndarray, np.ndarray]:
    """A buffer whose first and last pages it shares with other memory, as one from the heap
    does, and that memory around it."""
    memory = mmap.mmap(-1, SIZE + 2 * written.PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    around = np.frombuffer(memory, dtype=np.uint8)
    around[:] = 0  # its pages present: one that is not proves nothing
    return np.frombuffer(memoryview(memory)[100:100 + SIZE], dtype=np.uint8), around


def test_writes_beside_a_buffer_on_its_end_pages_cost_no_hash(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    cells.ns["x"], around = _between_others()
    cells.save()
    around[50] = around[100 + SIZE + 10] = 1  # malloc's bookkeeping, another object
    saved = cells.save()
    assert (saved.hashed, saved.reused) == (0, SIZE)


@pytest.mark.parametrize("where", [0, SIZE - 1])
def test_a_write_to_a_buffer_on_a_page_it_shares_is_seen(tmp_path: Path, where: int) -> None:
    cells = _Cells(tmp_path)
    cells.ns["x"], around = _between_others()
    cells.save()
    around[50] = 1
    cells.ns["x"][where] = 7
    saved = cells.save()
    assert saved.hashed == CHUNK
    assert cells.saved(saved, "x")[where] == 7


def test_an_end_page_written_while_its_chunk_is_hashed_is_hashed_again() -> None:
    x, _ = _between_others()
    tracker = written.tracker()
    assert tracker is not None
    address = _address(x)
    assert tracker.prepare(address, SIZE, CHUNK, lambda first, end: True) == [None] * 8
    x[0] = 1  # written and put back while the chunks are hashed: their ids may hold the 1
    x[0] = 0
    tracker.hashed(address, SIZE, CHUNK, [f"id{i}" for i in range(8)])
    assert tracker.prepare(address, SIZE, CHUNK, lambda first, end: True) == \
        [None] + [f"id{i}" for i in range(1, 8)]


def test_an_unchanged_buffer_of_a_changed_group_is_kept_and_rewritten_if_gone(
        tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    cells.ns["pair"] = {"same": _own_pages(1), "other": _own_pages(0)}
    first = cells.save()
    chunks = set(cells.store.object_chunks(first.groups[0][0]))
    cells.ns["pair"]["other"][0] = 1
    gone = cells.store.disk.path(cells.store.object_chunks(first.groups[0][0])[0])
    gone.unlink()  # a chunk of "same": kept where the disk has it, written again where not
    saved = cells.save()
    assert saved.hashed == CHUNK
    assert len(set(cells.store.object_chunks(saved.groups[0][0])) - chunks) == 1
    assert gone.exists()
    assert cells.saved(saved, "pair")["same"].all()


def test_memory_mapped_anew_at_the_same_address_is_hashed(tmp_path: Path) -> None:
    cells = _Cells(tmp_path)
    cells.ns["x"] = _own_pages(1)
    cells.save()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    address = _address(cells.ns["x"])
    fixed = 0x10  # MAP_FIXED: fresh zero pages replace the array's, none of them written
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | fixed
    assert libc.mmap(address, SIZE, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0) == address
    saved = cells.save()
    assert saved.hashed == SIZE and not cells.saved(saved, "x").any()

"""A real worker, whose saves hash only what the kernel saw written, saves every write a cell
makes after cells that only read (`fabric.snapshot.written`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import cells_on_one_worker

from fabric.snapshot import Store, dumps, loads, written

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(written.tracker() is None,
                                 reason=f"this kernel does not track writes: {written.why()}")]

SIZE = 40 << 20  # three chunks of the store's
AT = SIZE // 2 + 12345

CELLS = [
    "import ctypes, numpy as np, torch\nx = np.zeros(SIZE, dtype=np.uint8)",
    "total = int(x.sum())",  # read only: its save hashes nothing of x
    "ctypes.memmove(x.ctypes.data + AT, b'\\x01', 1)",
    "total = int(x.sum())",
    "torch.from_numpy(x)[AT + 1] = 2",
    "memoryview(x)[AT + 2] = 3",
]


def test_a_worker_saves_each_write_after_cells_that_only_read(tmp_path: Path) -> None:
    dones = cells_on_one_worker(tmp_path, [cell.replace("SIZE", str(SIZE)).replace("AT", str(AT))
                                           for cell in CELLS])
    store = Store(tmp_path)
    saved = []
    for done in dones:
        assert done.status == "ok" and done.saved is not None, done
        blob = next(b for b, names, _ in done.saved.groups if names == ["x"])
        saved.append(loads(store.get_object(blob), {})["x"])
    expected = np.zeros(SIZE, dtype=np.uint8)
    for i, written_at in ((2, [AT]), (4, [AT, AT + 1]), (5, [AT, AT + 1, AT + 2])):
        expected[written_at[-1]] = len(written_at)
        assert np.array_equal(saved[i], expected), i
    assert np.array_equal(saved[1], saved[0]) and np.array_equal(saved[3], saved[2])


def test_a_worker_saves_a_write_to_a_buffer_it_loaded(tmp_path: Path) -> None:
    """A loaded buffer is tracked from its load on (its chunks were verified as they were
    read): a write to it in a later cell is saved."""
    x = np.zeros(SIZE, dtype=np.uint8)
    blob = Store(tmp_path).put_object(dumps({"x": x}, {}))

    read, wrote = cells_on_one_worker(tmp_path, ["total = int(x.sum())", f"x[{AT}] = 9"],
                                      groups=[(blob, ["x"])])
    assert read.saved is not None and wrote.saved is not None
    assert [b for b, names, _ in read.saved.groups if names == ["x"]] == [blob]
    [after] = [b for b, names, _ in wrote.saved.groups if names == ["x"]]
    x[AT] = 9
    assert np.array_equal(loads(Store(tmp_path).get_object(after), {})["x"], x)

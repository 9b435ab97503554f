"""The chunk lists the server remembers across restarts: appended, merged into a file sorted by
object, found there by bisection; a line that does not check, or a file out of order, only costs
a read of the object's index again, never a wrong list."""

from __future__ import annotations

import os
from pathlib import Path

from fabric.snapshot.chunklists import MERGE_LINES, ChunkLists


def _lists(count: int) -> dict[str, tuple[str, ...]]:
    return {os.urandom(16).hex(): tuple(os.urandom(16).hex() for _ in range(i % 4))
            for i in range(count)}


def _remembered(path: Path, lists: dict[str, tuple[str, ...]]) -> ChunkLists:
    remembered = ChunkLists(path)
    for ident, chunks in lists.items():
        remembered.add(ident, chunks)
    return remembered


def _keys(data: bytes) -> list[bytes]:
    return [line[:32] for line in data.splitlines()]


def test_appended_lists_are_merged_in_order_and_found_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "chunks"
    lists = _lists(MERGE_LINES + 10)
    _remembered(path, lists)
    ordered = (tmp_path / "chunks.sorted").read_bytes()
    keys = _keys(ordered)
    assert keys == sorted(keys) and len(keys) == MERGE_LINES + 1  # merged once past the limit
    assert len(path.read_bytes().splitlines()) == 9  # appended since
    restarted = ChunkLists(path)
    assert {i: restarted.get(i) for i in lists} == lists
    assert restarted.get(os.urandom(16).hex()) is None


def test_a_removed_objects_line_goes_at_the_next_merge(tmp_path: Path) -> None:
    path = tmp_path / "chunks"
    lists = _lists(MERGE_LINES + 1)
    remembered = _remembered(path, lists)
    removed = sorted(lists)[:5]
    for ident in removed:
        remembered.forget(ident)
    assert remembered.get(removed[0]) == lists[removed[0]]  # back before the merge: it stays
    for ident, chunks in _lists(MERGE_LINES).items():  # till the next merge
        remembered.add(ident, chunks)
    left = set(_keys((tmp_path / "chunks.sorted").read_bytes()))
    assert removed[0].encode() in left and not left & {i.encode() for i in removed[1:]}
    assert ChunkLists(path).get(removed[0]) == lists[removed[0]]


def test_a_damaged_or_misplaced_line_is_never_taken_for_a_list(tmp_path: Path) -> None:
    path = tmp_path / "chunks"
    lists = _lists(MERGE_LINES + 1)
    _remembered(path, lists)
    ordered = tmp_path / "chunks.sorted"
    lines = ordered.read_bytes().splitlines(keepends=True)
    damaged = lines[len(lines) // 2]
    lines[len(lines) // 2] = damaged[:40] + bytes([damaged[40] ^ 1]) + damaged[41:]
    ordered.write_bytes(b"".join(reversed(lines)))  # out of order, one line flipped
    restarted = ChunkLists(path)
    found = {i: restarted.get(i) for i in lists}
    assert all(found[i] in (None, chunks) for i, chunks in lists.items())
    assert found[damaged[:32].decode()] is None
    for ident, chunks in lists.items():  # as each index is read again
        restarted.add(ident, chunks)
    _remembered(path, _lists(MERGE_LINES))  # the next merge puts them back in order
    assert {i: ChunkLists(path).get(i) for i in lists} == lists


def test_a_long_appended_file_an_earlier_version_left_is_merged_at_first_use(
        tmp_path: Path) -> None:
    path = tmp_path / "chunks"
    lists = _lists(MERGE_LINES + 1)
    _remembered(path, lists)
    ordered = tmp_path / "chunks.sorted"
    path.write_bytes(path.read_bytes() + ordered.read_bytes())  # every line appended
    ordered.unlink()
    some = next(iter(lists))
    assert ChunkLists(path).get(some) == lists[some]
    assert not path.read_bytes() and len(_keys(ordered.read_bytes())) == MERGE_LINES + 1

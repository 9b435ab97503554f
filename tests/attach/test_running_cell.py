"""What a kernel keeps of the cell it runs, for a notebook reopened while it runs
(`fabric.attach.frontend.RunningCell`), and of the cells that ended, for a notebook reloaded
before it was saved (`EndedCells`)."""

from __future__ import annotations

from fabric.attach.frontend import EndedCells, RunningCell, saved_time


def _stream(text: str) -> dict:
    return {"name": "stdout", "text": text}


def test_outputs_are_kept_in_order_with_their_seq() -> None:
    running = RunningCell("cell-1", "msg-1", 7)
    assert [running.record("stream", _stream(f"{i}\n")) for i in range(3)] == [0, 1, 2]
    snapshot = running.snapshot()
    assert snapshot["cell_id"] == "cell-1" and snapshot["msg_id"] == "msg-1"
    assert snapshot["execution_count"] == 7 and snapshot["next"] == 3
    assert not snapshot["dropped"]
    assert [(o["seq"], o["msg_type"], o["content"]["text"]) for o in snapshot["outputs"]] == \
        [(0, "stream", "0\n"), (1, "stream", "1\n"), (2, "stream", "2\n")]


def test_past_the_bound_the_earliest_outputs_go_and_that_is_said() -> None:
    running = RunningCell(None, "msg", 1, keep=1000)
    for i in range(100):
        running.record("stream", _stream(f"{i:04d}" * 10))
    snapshot = running.snapshot()
    assert snapshot["dropped"] and snapshot["next"] == 100
    seqs = [o["seq"] for o in snapshot["outputs"]]
    assert seqs == list(range(seqs[0], 100)) and 0 < len(seqs) < 100
    assert running.size <= 1000


def test_a_clear_output_leaves_only_what_follows_it() -> None:
    running = RunningCell("c", "m", 1, keep=1000)
    for i in range(100):
        running.record("stream", _stream(f"{i:04d}" * 10))
    assert running.record("clear_output", {"wait": False}) == 100
    running.record("display_data", {"data": {"text/plain": "x"}, "metadata": {}})
    snapshot = running.snapshot()
    assert not snapshot["dropped"]  # nothing before the clear would show anyway
    assert [(o["seq"], o["msg_type"]) for o in snapshot["outputs"]] == [(101, "display_data")]
    running.record("clear_output", {"wait": True})  # kept: it clears at the next output
    assert running.snapshot()["outputs"][-1]["msg_type"] == "clear_output"


def _ended(ended: EndedCells, cell_id: str | None, count: int, at: float,
           text: str = "") -> None:
    """A cell started and ended at `at`, as `Frontend` records it."""
    cell = RunningCell(cell_id, f"msg-{count}", count, source=f"cell {count}",
                       after=ended.last(cell_id))
    cell.record("stream", _stream(text or f"{count}\n"))
    cell.ended = at
    ended.add(cell)


def test_the_cells_that_ended_after_a_save_each_as_it_last_ran_and_where() -> None:
    ended = EndedCells()
    for cell_id, count, at in (("a", 1, 10.0), ("b", 2, 20.0), (None, 3, 25.0), ("c", 4, 30.0),
                               ("b", 5, 40.0), ("b", 6, 50.0)):
        _ended(ended, cell_id, count, at)
    since = ended.since(15.0)  # the notebook was saved at 15
    assert [(c["cell_id"], c["execution_count"], c["after"]) for c in since] == \
        [("c", 4, "b"), ("b", 6, "c")]  # run again at once, b keeps the place it had
    assert since[-1]["source"] == "cell 6" and since[-1]["outputs"][0]["content"]["text"] == "6\n"
    assert [c["cell_id"] for c in ended.since(0.0)] == ["a", "c", "b"]


def test_past_the_bound_the_earliest_cells_go() -> None:
    ended = EndedCells(keep=1000)
    for count in range(20):
        _ended(ended, f"c{count}", count, float(count), "x" * 200)
    kept = [c["cell_id"] for c in ended.since(0.0)]
    assert 0 < len(kept) < 20 and kept[-1] == "c19"


def test_a_saved_time_is_read_as_jupyter_writes_it() -> None:
    assert saved_time("1970-01-01T00:01:40.5Z") == 100.5
    assert saved_time("1970-01-01T00:01:40") == 100.0  # no zone: Jupyter's are UTC
    assert saved_time("yesterday") is None and saved_time(None) is None

"""What a kernel keeps of the cell it runs, for a notebook reopened while it runs
(`fabric.attach.frontend.RunningCell`)."""

from __future__ import annotations

from fabric.attach.frontend import RunningCell


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

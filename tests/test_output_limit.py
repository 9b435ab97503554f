"""A cell's outputs within their limit: cut where it falls, the rest counted and summarised."""

from __future__ import annotations

from fabric.output_limit import Budget


def _stream(text: str, name: str = "stdout") -> dict:
    return {"output_type": "stream", "name": name, "text": text}


def test_a_stream_is_cut_at_the_limit_on_a_character_and_the_rest_counted() -> None:
    budget = Budget(limit=10)
    assert budget.admit(_stream("abcdef")) == _stream("abcdef")
    assert budget.admit(_stream("ghé€xyz")) == _stream("ghé")  # 4 bytes left: € would split
    assert budget.admit(_stream("more")) is None
    image = {"output_type": "display_data", "data": {"image/png": "A" * 100}, "metadata": {}}
    assert budget.admit(image) is None
    summary = budget.summary()
    assert summary["name"] == "stderr" and "output limit reached" in summary["text"]
    assert f"{budget.left_out:,} more bytes in 3 outputs" in summary["text"]


def test_errors_and_clears_always_pass_and_nothing_left_out_says_nothing() -> None:
    budget = Budget(limit=4)
    error = {"output_type": "error", "ename": "E", "evalue": "x" * 100, "traceback": []}
    assert budget.admit(error) is error
    assert budget.admit({"output_type": "clear_output", "wait": False}) is not None
    assert budget.admit(_stream("abcd")) is not None and budget.summary() is None


def test_an_earlier_hops_summary_passes_once_a_cells_own_lookalikes_do_not() -> None:
    upstream = Budget(limit=4)
    upstream.admit(_stream("abcdefgh"))
    summary = upstream.summary()
    budget = Budget(limit=4)
    assert budget.admit(_stream("abcd")) is not None
    assert budget.admit(summary) == summary
    assert budget.admit(summary) is None  # a cell printing the same text is counted

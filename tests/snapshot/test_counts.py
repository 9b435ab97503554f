"""The ledger's reference counts, packed and sorted, against a Counter."""

from __future__ import annotations

import collections

from hypothesis import given
from hypothesis import strategies as st

from fabric.snapshot.counts import Counts, pack_ids, unpack_ids

IDS = [f"{n:032x}" for n in (0, 1, 7, 2**64, 2**127, 2**128 - 1)]
deltas = st.dictionaries(st.sampled_from(IDS), st.integers(-2, 3), max_size=len(IDS))


@given(st.lists(deltas, max_size=8))
def test_counts_change_as_a_counter_does_and_say_what_fell_to_and_rose_from_none(
        rounds: list[dict[str, int]]) -> None:
    counts, counter = Counts(), collections.Counter[str]()
    for changes in rounds:
        changes = {i: max(d, -counter[i]) for i, d in changes.items()}  # never below none
        before = {i for i, n in counter.items() if n > 0}
        counter.update(changes)
        after = {i for i, n in counter.items() if n > 0}
        assert counts.change(changes) == (before - after, after - before)
        assert {i: counts[i] for i in IDS} == {i: counter[i] for i in IDS}
        assert counts.names() == after and len(counts) == len(after)
    again = Counts(*counts.packed())
    assert {i: again[i] for i in IDS} == {i: counter[i] for i in IDS}


def test_a_name_that_is_not_an_id_is_held_by_none() -> None:
    counts = Counts()
    counts.change({IDS[1]: 1})
    assert IDS[1] in counts and ".tmp-x" not in counts and counts["ledger"] == 0


def test_ids_pack_to_16_bytes_each_and_back() -> None:
    assert len(pack_ids(IDS)) == 16 * len(IDS) and unpack_ids(pack_ids(IDS)) == set(IDS)

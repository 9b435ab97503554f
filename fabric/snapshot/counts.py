"""How many sessions hold each file, for the ledger of a large store, as two sorted arrays.

A Counter of every live file costs a Python object per file to build: loaded from a saved ledger
at a server's start, that alone would grow with the store (about half a second for 200,000
files). `Counts` keeps the ids packed, 16 bytes each and sorted, beside an array of their counts:
it loads as two byte strings, finds an id by bisection, and applies a pass's changes in one merge
that copies the arrays at memory speed.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Mapping

from .tiers import valid_id

ID = 16  # the bytes of an id (32 hex digits), packed


def pack_ids(idents: Iterable[str]) -> bytes:
    return b"".join(bytes.fromhex(i) for i in idents)


def unpack_ids(data: bytes) -> set[str]:
    """The ids `pack_ids` packed; ValueError if `data` cannot be such."""
    if len(data) % ID:
        raise ValueError("packed ids of a bad length")
    text = data.hex()
    return {text[at:at + 2 * ID] for at in range(0, len(text), 2 * ID)}


class _Ids:
    """Packed ids as a sequence of 16-byte strings, for `bisect`."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data) // ID

    def __getitem__(self, at: int) -> bytes:
        return self.data[at * ID:(at + 1) * ID]


class Counts:
    def __init__(self, ids: bytes = b"", counts: bytes = b"") -> None:
        """`ids` and `counts` as `packed` gives them; ValueError if they do not fit."""
        self.ids = ids
        self.counts = array("I")
        self.counts.frombytes(counts)
        if len(ids) % ID or len(self.counts) != len(ids) // ID:
            raise ValueError("ids and counts do not fit")

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, ident: str) -> int:
        """How many hold `ident` (0 for any name that is not an id)."""
        if not valid_id(ident):
            return 0
        key = bytes.fromhex(ident)
        at = bisect.bisect_left(_Ids(self.ids), key)
        return self.counts[at] if _Ids(self.ids)[at] == key else 0

    def __contains__(self, ident: object) -> bool:
        return isinstance(ident, str) and self[ident] > 0

    def change(self, deltas: Mapping[str, int]) -> tuple[set[str], set[str]]:
        """Add `deltas` (id -> a change of its count); the ids none holds any more, and those
        none held before."""
        ids, dropped, added = _Ids(self.ids), set[str](), set[str]()
        pieces: list[bytes] = []
        counts = array("I")
        start = 0  # the first entry not copied yet
        for key, delta in sorted((bytes.fromhex(i), d) for i, d in deltas.items() if d):
            at = bisect.bisect_left(ids, key, start)
            pieces.append(self.ids[start * ID:at * ID])
            counts.extend(self.counts[start:at])
            present = ids[at] == key
            before = self.counts[at] if present else 0
            after = before + delta
            if after > 0:
                pieces.append(key)
                counts.append(after)
            if before > 0 >= after:
                dropped.add(key.hex())
            elif before <= 0 < after:
                added.add(key.hex())
            start = at + present
        pieces.append(self.ids[start * ID:])
        counts.extend(self.counts[start:])
        self.ids, self.counts = b"".join(pieces), counts
        return dropped, added

    def names(self) -> set[str]:
        """Every id held, as a set: for a pass that asks about nearly every file."""
        return unpack_ids(self.ids)

    def packed(self) -> tuple[bytes, bytes]:
        return self.ids, self.counts.tobytes()

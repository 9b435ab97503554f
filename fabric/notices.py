"""What llfabric says about itself while it runs cells: kept out of the cells' outputs.

A notebook's outputs are its user's. A notice (a value kept only by its worker, a wait for an
execution slot, a long save) is a short record, ``{"topic", "text", "time"}``: a session sends it
as a ``notice`` event of the execute it concerns, lists a cell's notices in its reply and keeps
the latest for ``status``; clients show them where a tool's status belongs (`%llfabric status`,
the kernel's log, `llfabric run`'s table). Only a loss the user must act on, a value neither
saved nor held any more, is also shown in the cell, as an error output (`loss`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from .protocol import Wire

KEEP = 20  # notices a session keeps for `status`
LOSS = "LLFabricStateLost"  # the ename of a loss shown in a cell


def notice(topic: str, text: str) -> Wire:
    return {"topic": topic, "text": text, "time": time.time()}


def loss(text: str) -> Wire:
    """The error output that tells the user, in the cell, of state they must recompute."""
    return {"output_type": "error", "ename": LOSS, "evalue": text,
            "traceback": [f"llfabric: {text}"]}


def topics(names: Iterable[str]) -> str:
    """A cell's notices in a word or two each, for a table column."""
    return ",".join(dict.fromkeys(names))

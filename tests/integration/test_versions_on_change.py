"""A version only where a cell changes state, on a real server: cells that only read (`print(x)`,
`x`, `1+1`) leave the head where it was and take no retention slot, while prompt numbers go on."""

from __future__ import annotations

from pathlib import Path

from helpers import execute, open_session, serving, text

from fabric.client import Client

FIRST = "import numpy as np\nx = np.arange(3)"
READERS = ("print(x)", "x", "1 + 1", "x.sum()", "y = 1\ndel y\nlen(x)", "print(undefined)")


def _changes_nothing(client: Client, session: str) -> None:
    first, _ = execute(client, session, FIRST)
    assert first["status"] == "ok"
    for source in READERS:
        reply, outputs = execute(client, session, source)
        assert reply["version"] == first["version"], source  # the head stays
        assert text(outputs), source  # its outputs are shown all the same
    counts = [v["execution_count"] for v in client.versions(session)]
    assert counts == [1]  # newest first: only the cell that made `np` and `x`
    # the kernel's history (a restarted kernel reads it) has them all, in their order
    assert client.call("history", session=session).cells == \
        tuple(enumerate([FIRST, *READERS], 1))
    status = client.status().session(session)
    assert status is not None and status.version == first["version"]
    assert status.execution_count == 1 + len(READERS)  # the prompt of the latest cell


def _changes(client: Client, session: str) -> None:
    """Each kind of change makes a version, numbered by the cell that made it."""
    before = client.status().session(session)
    assert before is not None
    changes = ["x[0] = 5", "import json", "del x", "import random\nrandom.random()"]
    for source in changes:
        reply, _ = execute(client, session, source)
        assert reply["status"] == "ok", source
    versions = client.versions(session)
    assert [v["version"] for v in versions[:len(changes)]] == \
        list(range(before.version + len(changes), before.version, -1))
    assert [v["execution_count"] for v in versions[:len(changes)]] == \
        list(range(before.execution_count + len(changes), before.execution_count, -1))
    assert (versions[3]["changed"], versions[2]["added"], versions[1]["removed"]) == \
        (["x"], ["json"], ["x"])
    assert versions[0]["first_line"] == "import random"  # the RNG's state is the session's


def test_on_fresh_workers_each_cell(client: Client, session: str) -> None:
    """Every cell on a fresh worker loaded from the store (the module's server)."""
    _changes_nothing(client, session)
    _changes(client, session)


def test_on_a_kept_worker(tmp_path: Path) -> None:
    with serving(tmp_path / "store") as server, server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        _changes_nothing(client, session)
        _changes(client, session)
        # a later client (a kernel restarted) numbers its next cell after the latest one
        reply, _ = execute(client, session, "z = 1")
        assert reply["execution_count"] == 2 + len(READERS) + 4

"""How a cell started (prepared, warm, cold; restored: tests/pool/test_parking.py), on a real
server: in the cell's reply, the session's status and `%llfabric status`, which speaks of the
host's slots without the word for where the worker is."""

from __future__ import annotations

from pathlib import Path

from helpers import execute, open_session, serving

from fabric.attach.magics import describe


def test_each_cell_says_how_it_started(tmp_path: Path) -> None:
    with serving(tmp_path / "store", linger=0) as server, server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        assert client.status().session(session).started is None  # no cell yet
        starts = [execute(client, session, "x = 1")[0]["start"],  # a worker made for it
                  execute(client, session, "x += 1")[0]["start"]]  # the one kept after it
        client.call("close", session=session)  # its worker goes with it
        client.call("open", session=session, cwd=str(tmp_path))
        client.call("draft", session=session, source="print(x)")  # as the user types it
        reply, _ = execute(client, session, "print(x)")
        starts.append(reply["start"])
        assert (starts, reply["path"]) == (["cold", "warm", "prepared"], "draft")
        status = client.status()
        assert status.session(session).started == "prepared"
        said = describe(status, session)
        assert "its latest cell started prepared (on a worker readied while it was edited)" \
            in said
        assert f"slots: {status.leases.slots} cpu (" in said and "tier" not in said

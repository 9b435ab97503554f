"""Lingering: after its cell a kept worker stays on its lease for `linger` seconds, so the
session's next cell in that time starts on it with no resume; the lease goes back at once when
another session's cell waits for it or the session closes, and after the time, when the worker
is parked as it is with `linger` 0. Real servers, real workers, one CPU slot.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import (
    RunningServer,
    execute,
    open_session,
    serving,
    session_status,
    text,
    wait_until,
)

from fabric.client import Client
from fabric.status import SlotStatus


@pytest.fixture(scope="module")
def lingering(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # an hour: only the next cell, another session's cell or a close ends a linger here
    with serving(tmp_path_factory.mktemp("store"), slots=1, linger=3600) as running:
        yield running


def _slot(client: Client) -> SlotStatus:
    return client.status().leases.leases[0]


def test_the_next_cell_starts_on_the_lingering_worker_with_no_wait(lingering: RunningServer,
                                                                   tmp_path: Path) -> None:
    with lingering.client() as client:
        session = open_session(client, tmp_path)
        first, _ = execute(client, session, "x = [1, 2]")
        slot = _slot(client)
        assert (slot.session, slot.lingering) == (session, True)
        status = session_status(client, session)
        # the linger counts as held time, before the lease goes back
        assert status.lease_seconds >= first["timings"]["lease_held"] > 0
        reply, outputs = execute(client, session, "x.append(3)\nprint(x)")
        assert (reply["path"], text(outputs)) == ("lingered", "[1, 2, 3]\n")
        assert reply["timings"]["queue"] == 0.0 and reply["timings"]["prepare"] == 0.0
        assert session_status(client, session).worker == status.worker
        assert _slot(client).lingering  # lingering again, after this cell
        held = client.call("close", session=session).lease_seconds
        assert _slot(client).session is None  # a close gives the lease back at once
        assert held >= first["timings"]["lease_held"] + reply["timings"]["lease_held"]


def test_another_sessions_cell_takes_the_slot_from_a_lingering_worker(
        lingering: RunningServer, tmp_path: Path) -> None:
    with lingering.client() as client:
        first = open_session(client, tmp_path)
        execute(client, first, "x = 1")
        assert _slot(client).session == first
        other = open_session(client, tmp_path)
        # done within the client's 120 s, long before the hour the first worker would linger
        reply, outputs = execute(client, other, "print('mine')")
        assert (reply["status"], text(outputs)) == ("ok", "mine\n")
        # the first session's worker was parked, not lost: its next cell resumes it
        reply, outputs = execute(client, first, "print(x + 1)")
        assert (reply["path"], text(outputs)) == ("warm", "2\n")
        for session in (first, other):
            client.call("close", session=session)


def test_a_lingering_worker_that_dies_gives_its_lease_back(lingering: RunningServer,
                                                           tmp_path: Path) -> None:
    with lingering.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "x = 'committed'")
        psutil.Process(session_status(client, session).worker).kill()
        wait_until(lambda: _slot(client).session is None, "the lease's return")
        reply, outputs = execute(client, session, "print(x)")
        assert (reply["path"], text(outputs)) == ("cold", "committed\n")
        client.call("close", session=session)


def test_the_worker_parks_when_the_linger_ends(tmp_path: Path) -> None:
    with serving(tmp_path / "store", slots=1, linger=1) as server, server.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "x = 41")
        wait_until(lambda: _slot(client).session is None, "the lease's return")
        assert session_status(client, session).tier == "warm"  # parked, kept
        reply, outputs = execute(client, session, "print(x + 1)")
        assert (reply["path"], text(outputs)) == ("warm", "42\n")


def test_no_linger_gives_the_lease_back_with_the_reply(tmp_path: Path) -> None:
    with serving(tmp_path / "store", slots=1, linger=0) as server, server.client() as client:
        session = open_session(client, tmp_path)
        execute(client, session, "x = 41")
        assert _slot(client).session is None
        reply, outputs = execute(client, session, "print(x + 1)")
        assert (reply["path"], text(outputs)) == ("warm", "42\n")

"""A cell whose draft missed loads only what it reads whatever branch it takes; what only a
branch it may not take reads loads when that branch is entered. Each test checks what a pinned
session would show, on real servers with real workers, and that what was never loaded stays in
the session as it was."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import RunningServer, execute, open_session, serving, text, wait_until

from fabric.client import Client


def _set(client: Client, session: str, flag: bool) -> None:
    reply, _ = execute(client, session, f"big = list(range(10))\nsmall = 1\nflag = {flag}")
    assert reply["status"] == "ok"


def test_a_branch_not_taken_loads_nothing_it_alone_reads(client: Client, session: str) -> None:
    _set(client, session, False)
    reply, outputs = execute(client, session, "if flag:\n    print(len(big))\nprint(small)")
    assert (reply["path"], text(outputs)) == ("cold", "1\n")
    assert reply["closure"]["lazy"] == 1 and reply["unneeded"] == ["big"]
    reply, outputs = execute(client, session, "print(len(big))")  # kept as the session had it
    assert text(outputs) == "10\n" and reply["unneeded"] == []


def test_a_branch_taken_loads_what_it_reads_when_entered(client: Client, session: str) -> None:
    _set(client, session, True)
    reply, outputs = execute(client, session, "print(small)\nif flag:\n    print(len(big))\n"
                                              "else:\n    print('no')")
    assert text(outputs) == "1\n10\n" and reply["unneeded"] == []


def test_what_the_cell_bound_before_the_branch_is_not_loaded_over(client: Client,
                                                                  session: str) -> None:
    _set(client, session, True)
    execute(client, session, "a = [1]\nb = {'k': a}")  # one group: they share a list
    reply, outputs = execute(client, session, "if flag:\n    big = 'mine'\n"
                                              "a = 5\n"
                                              "if flag:\n    print(big, a, b)")
    assert reply["status"] == "ok" and text(outputs) == "mine 5 {'k': [1]}\n"
    _, outputs = execute(client, session, "print(big, a, b)")
    assert text(outputs) == "mine 5 {'k': [1]}\n"


def test_a_name_deleted_in_one_branch_stays_deleted_in_the_next(client: Client,
                                                                session: str) -> None:
    _set(client, session, True)
    reply, outputs = execute(client, session, "if flag:\n    del big\n"
                                              "if flag:\n    try:\n        big\n"
                                              "    except NameError:\n        print('gone')")
    assert reply["status"] == "ok" and text(outputs) == "gone\n"
    _, outputs = execute(client, session, "print('big' in dir())")
    assert text(outputs) == "False\n"


def test_reads_hidden_in_magics_and_in_session_code_load_too(client: Client,
                                                            session: str) -> None:
    _set(client, session, True)
    execute(client, session, "def count():\n    return len(big)")
    reply, outputs = execute(client, session, "if flag:\n    %time n = count()\n"
                                              "try:\n    pass\nexcept ValueError:\n    pass\n"
                                              "else:\n    print(n, small)")
    assert reply["status"] == "ok" and text(outputs).endswith("10 1\n")
    reply, outputs = execute(client, session, "if not flag:\n    print(count())\nprint(small)")
    assert text(outputs) == "1\n" and reply["unneeded"] == ["big", "count"]  # and what it reads


def test_a_read_the_branch_test_makes_is_loaded_before_the_cell(client: Client,
                                                                session: str) -> None:
    _set(client, session, False)
    reply, outputs = execute(client, session, "if len(big) > 3:\n    print(small)")
    assert text(outputs) == "1\n" and reply["closure"]["lazy"] == 1  # small's, not big's
    assert reply["unneeded"] == []


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # workers kept 3 s from the end of their cell: long enough for the next cell, short enough
    # to wait out
    with serving(tmp_path_factory.mktemp("store"), keep_warm=3, linger=0) as running:
        yield running


def _tier(client: Client, session: str) -> str:
    return next(s for s in client.status().sessions if s.session == session).tier


def test_a_kept_worker_loads_what_its_last_cell_never_needed(warm: RunningServer,
                                                             tmp_path: Path) -> None:
    with warm.client() as client:
        session = open_session(client, tmp_path)
        _set(client, session, False)
        wait_until(lambda: _tier(client, session) == "cold", "the worker retired", 30)
        reply, _ = execute(client, session, "if flag:\n    print(big)\nsmall += 1")
        assert (reply["path"], reply["unneeded"]) == ("cold", ["big"])
        reply, outputs = execute(client, session, "print(len(big), small)")
        assert reply["path"] == "warm+load" and text(outputs) == "10 2\n"

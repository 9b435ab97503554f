"""Kept workers under memory limits, on real servers and workers: they leave least worth first,
only as many as the limit needs; one that holds what the store cannot keep is cooled, never
dropped; a user past their memory has their kept workers leave first, then their cells refused.
Memory is driven by limits the test sets, not by filling the machine."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from helpers import (
    execute,
    execute_in_thread,
    free_port,
    open_session,
    require_criu,
    serving,
    session_status,
    text,
    wait_until,
)
from prometheus_client.parser import text_string_to_metric_families

from cli.status import describe
from fabric.client import Client
from fabric.errors import RemoteError
from fabric.status import ServerStatus

MIB = 1 << 20
BIG = "big = bytes(range(256)) * ({mib} * 4096)"  # `mib` MiB, every page touched


def _evicted(info: ServerStatus) -> dict[tuple[str, str], int]:
    assert info.memory is not None
    return {(e.why, e.how): e.count for e in info.memory.evicted}


def _tiers(client: Client, *sessions: str) -> list[str]:
    return [session_status(client, s).tier for s in sessions]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body) for sample in family.samples}


def test_the_session_being_edited_keeps_its_warm_worker_past_kept_memory(tmp_path: Path) -> None:
    # Three kept workers, two of them holding 100 MiB each: past 220 MiB one must go, and one is
    # enough. The small one is the oldest, but its user is editing its next cell (a draft).
    port = free_port()
    with serving(tmp_path / "store", linger=0, keep_warm=3600, kept_memory=220 * MIB,
                 memory_pressure=100, memory_relief=99, memory_stall=0,
                 metrics_bind=f"127.0.0.1:{port}") as server, server.client() as client:
        edited, first, second = (open_session(client, tmp_path) for _ in range(3))
        execute(client, edited, "x = 1")
        execute(client, first, BIG.format(mib=100))
        client.draft(edited, "print(x + 1)")
        execute(client, second, BIG.format(mib=100))
        wait_until(lambda: sum(_evicted(client.status()).values()) >= 1, "an eviction")
        info = client.status()
        assert _evicted(info) == {("kept_memory", "retired"): 1}  # one was enough
        assert session_status(client, edited).tier == "warm"
        assert sorted(_tiers(client, first, second)) == ["cold", "warm"]
        assert info.memory is not None and 0 < info.memory.kept <= 220 * MIB
        said = next(line for line in describe(info) if line.startswith("memory"))
        assert "of 220 MiB (kept_memory), 1 retired for kept_memory" in said, said
        big = next(s for s in (first, second) if session_status(client, s).tier == "warm")
        metrics = _scrape(port)
        held = metrics[("llfabric_session_memory_bytes", (("session", big), ("tier", "warm")))]
        assert 100 * MIB < held < 220 * MIB  # its PSS: the zygote's pages count a share
        assert metrics[("llfabric_workers_evicted_total",
                        (("how", "retired"), ("why", "kept_memory")))] == 1
        reply, outputs = execute(client, edited, "print(x + 1)")
        assert (reply["path"], text(outputs)) == ("warm", "2\n")


def test_a_worker_holding_what_the_store_cannot_keep_is_cooled_and_leaves_last(
        tmp_path: Path) -> None:
    require_criu("cooling a pinned worker")
    with serving(tmp_path / "store", linger=0, keep_warm=3600, cool_after=3600,
                 kept_memory=100 * MIB, memory_pressure=100, memory_relief=99, memory_stall=0,
                 worker_source="zygote") as server, server.client() as client:
        pinned, warm = open_session(client, tmp_path), open_session(client, tmp_path)
        reply, _ = execute(client, pinned, "g = (i for i in range(10))")
        assert reply["unsaved"] == ["g"]
        execute(client, warm, BIG.format(mib=100))
        # the warm one leaves, though the pinned one is older; that is enough
        wait_until(lambda: session_status(client, warm).tier == "cold", "the warm one leaving")
        assert session_status(client, pinned).tier == "warm"
        assert _evicted(client.status()) == {("kept_memory", "retired"): 1}

        held = open_session(client, tmp_path)
        reply, _ = execute(client, held, f"h = (i for i in range(10))\n{BIG.format(mib=100)}")
        assert reply["unsaved"] == ["h"]
        wait_until(lambda: session_status(client, held).tier == "cool", "a cooled worker")
        assert ("kept_memory", "cooled") in _evicted(client.status())
        reply, outputs = execute(client, held, "print(next(h), len(big) // 2**20)")
        assert (reply["source"], text(outputs)) == ("cool", "0 100\n")


def test_a_user_past_user_memory_has_their_kept_workers_leave_then_their_cells_refused(
        tmp_path: Path) -> None:
    go = tmp_path / "go"
    with serving(tmp_path / "store", linger=0, keep_warm=3600, user_memory=100 * MIB,
                 memory_pressure=100, memory_relief=99, memory_stall=0) as server, \
            server.client() as client:
        kept, running, refused = (open_session(client, tmp_path) for _ in range(3))
        execute(client, kept, "x = 1")
        assert session_status(client, kept).tier == "warm"  # well within the limit
        thread, result = execute_in_thread(server, running, (
            f"import os, time\n{BIG.format(mib=120)}\n"
            f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)"))
        try:
            wait_until(lambda: session_status(client, running).memory > 100 * MIB,
                       "the running cell's memory")
            # the user's kept worker leaves first; the running cell alone is still past it
            wait_until(lambda: session_status(client, kept).tier == "cold", "the kept one leaving")
            with pytest.raises(RemoteError, match=r"user_memory = 104857600") as refusal:
                execute(client, refused, "print('ran')")
            assert refusal.value.kind == "limit"
        finally:
            go.touch()
            thread.join(120)
        assert result["reply"]["status"] == "ok"
        assert _evicted(client.status())[("user_memory", "retired")] >= 1
        # its worker, kept past the limit, leaves too: the refused session's cell runs now
        wait_until(lambda: session_status(client, running).tier == "cold", "the last one leaving")
        reply, outputs = execute(client, refused, "print('ran')")
        assert (reply["status"], text(outputs)) == ("ok", "ran\n")

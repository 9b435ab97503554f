"""A remote tier that misbehaves under a real server (`flaky_remote`): slow, refusing writes,
full, hanging. A commit that needs the remote is acknowledged only once the remote holds it;
one the remote fails tells its cell what failed and commits nothing, and the next cells go on
once the remote heals. A remote filled behind keeps its backlog, in status and metrics, through
a restart, until it is sent."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from flaky_remote import Flaky
from helpers import execute, execute_in_thread, free_port, serving, text
from prometheus_client.parser import text_string_to_metric_families

from cli.status import describe
from fabric.client import Client
from fabric.errors import RemoteError
from fabric.snapshot import Manifest, Store, codec

WAIT = 120.0  # seconds a test waits for what a loaded machine may be slow to do


def _until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def _on_the_remote(flaky: Flaky, store: Path, session: str, there: Path) -> dict:
    """The session's head as a host whose disk is empty (at `there`) takes it up from the
    remote, which must hold this disk's head whole: the values of its groups."""
    here = Store(store)
    elsewhere = Store(there, key=here.key, remote=flaky.url)
    head = here.head(session)
    assert head is not None and elsewhere.adopt_head(session) == head
    manifest = Manifest.decode(elsewhere.get_manifest(head))  # checked against the key
    wanted = [g.blob for g in manifest.groups] + manifest.blobs()  # its ambient and catalog too
    elsewhere.fetch(wanted)
    assert all(map(elsewhere.has, wanted))
    return {n: v for g in manifest.groups
            for n, v in codec.loads(elsewhere.get_object(g.blob), {}).items()}


def test_a_slow_remote_holds_each_commit_back_but_no_other_session(tmp_path: Path) -> None:
    flaky = Flaky(tmp_path / "remote")
    with serving(tmp_path / "store", env=flaky.env(), keep_warm=0, remote=flaky.url) as server, \
            server.client() as client:
        for name in ("slow", "other"):
            client.call("open", session=name, cwd=str(tmp_path))
        execute(client, "other", "n = 6")
        flaky.set(latency=0.05)  # each call to the remote
        reply, _ = execute(client, "slow", "import numpy as np\na = np.arange(3_000_000)")
        assert reply["status"] == "ok" and reply["version"] == 1
        flaky.set(hold=True)  # and now it hangs
        thread, result = execute_in_thread(server, "slow", "a = a * 2")
        _until("a write waits on the remote", lambda: flaky.holding)
        _, outputs = execute(client, "other", "print(n * 7)")  # its cell commits nothing
        assert text(outputs) == "42\n"
        assert client.status().session("other") is not None
        assert thread.is_alive() and not result  # the slow commit is not acknowledged yet
        flaky.set()
        thread.join()
        assert result["reply"]["version"] == 2
    values = _on_the_remote(flaky, tmp_path / "store", "slow", tmp_path / "there")
    assert np.array_equal(values["a"], np.arange(3_000_000) * 2)


def test_a_remote_that_refuses_writes_or_is_full_fails_the_cell_and_loses_nothing(
        tmp_path: Path) -> None:
    flaky = Flaky(tmp_path / "remote")
    with serving(tmp_path / "store", env=flaky.env(), keep_warm=0, remote=flaky.url) as server, \
            server.client() as client:
        client.call("open", session="nb", cwd=str(tmp_path))
        execute(client, "nb", "import numpy as np\nx = [1, 2]\na = np.arange(100_000)")
        for how, kind, cause in [({"fail": "PermissionError"}, "remote_failed", "refuses"),
                                 ({"fail": "OSError", "only": "/manifests/"}, "remote_failed",
                                  "refuses"),
                                 ({"fail": "PermissionError", "only": "/after/"},
                                  "remote_failed", "refuses"),  # the head's move
                                 ({"capacity": 0}, "remote_full", "No space left")]:
            flaky.set(**how)
            with pytest.raises(RemoteError) as err:
                execute(client, "nb", "x.append(3)\na = np.arange(2_000_000)")
            assert err.value.kind == kind, err.value.message
            assert flaky.url in err.value.message and cause in err.value.message
            assert "nothing of the cell is committed: session nb stays at version 1" \
                in err.value.message
            assert client.status().session("nb").version == 1
        flaky.set()  # healed: the session goes on from its last commit
        _, outputs = execute(client, "nb", "print(x, len(a))\nx.append(4)")
        assert text(outputs) == "[1, 2] 100000\n"
        assert client.status().session("nb").version == 2
        assert server.alive()
    values = _on_the_remote(flaky, tmp_path / "store", "nb", tmp_path / "there")
    assert values["x"] == [1, 2, 4] and np.array_equal(values["a"], np.arange(100_000))


def test_a_commit_the_remote_never_answers_fails_at_its_deadline_and_the_next_goes_on(
        tmp_path: Path) -> None:
    """The claim of the head's move hangs: the cell is told at `remote_timeout`; the claim
    lands after all once the remote answers, and the next commit passes over it."""
    flaky = Flaky(tmp_path / "remote")
    with serving(tmp_path / "store", env=flaky.env(), keep_warm=0, remote=flaky.url,
                 remote_timeout=5) as server, server.client() as client:
        client.call("open", session="nb", cwd=str(tmp_path))
        execute(client, "nb", "x = 1")
        flaky.set(hold=True, only="/after/")
        with pytest.raises(RemoteError) as err:
            execute(client, "nb", "x = 2")
        assert err.value.kind == "remote_failed"
        assert "no answer in 5 s" in err.value.message, err.value.message
        flaky.set()
        _until("the late claim lands", lambda: len(flaky.files("sessions/nb/after")) == 2)
        _, outputs = execute(client, "nb", "print(x)\nx = 3")
        assert text(outputs) == "1\n"
        assert client.status().session("nb").version == 2
    assert _on_the_remote(flaky, tmp_path / "store", "nb", tmp_path / "there")["x"] == 3


def test_a_remote_filled_behind_keeps_its_backlog_through_a_restart(tmp_path: Path) -> None:
    """Its cells are acknowledged once this disk holds them, the remote down; the backlog is in
    status and metrics, outlives the server, and is sent once the remote heals."""
    flaky = Flaky(tmp_path / "remote")
    flaky.set(fail="TimeoutError")  # down from the start
    store = tmp_path / "store"
    settings = {"keep_warm": 0, "remote": flaky.url, "remote_writes": "behind"}

    def lags(client: Client, versions: int, failing: bool) -> bool:
        backlog = client.status().backlog
        assert backlog is not None and backlog.remote == flaky.url
        return backlog.versions == versions and ("TimeoutError" in backlog.failing) == failing

    with serving(store, env=flaky.env(), **settings) as server, server.client() as client:
        client.call("open", session="nb", cwd=str(tmp_path))
        for cell in ("import numpy as np\na = np.arange(500_000)", "b = 2", "a = a + b"):
            reply, _ = execute(client, "nb", cell)
            assert reply["status"] == "ok"
        _until("the backlog counts the three versions", lambda: lags(client, 3, True))
    assert flaky.files("sessions") == set()
    port = free_port()
    with serving(store, env=flaky.env(), metrics_bind=f"127.0.0.1:{port}", **settings) \
            as server, server.client() as client:
        _until("the restarted server counts them", lambda: lags(client, 3, True))
        assert f"remote {flaky.url}, filled behind: 3 versions of 1 sessions to send" \
            in "\n".join(describe(client.status()))  # `llfabric status`
        scraped = _scrape(port)
        assert scraped["llfabric_remote_backlog_versions"] == 3
        assert scraped["llfabric_remote_failing"] == 1
        flaky.set()  # healed: the next try sends them
        _until("the backlog is sent", lambda: lags(client, 0, False))
        assert _scrape(port)["llfabric_remote_backlog_versions"] == 0
    values = _on_the_remote(flaky, store, "nb", tmp_path / "there")
    assert np.array_equal(values["a"], np.arange(500_000) + 2)
    assert len(flaky.files("manifests")) == 3  # every version's, for its history


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return {sample.name: sample.value
                for family in text_string_to_metric_families(response.read().decode())
                for sample in family.samples if not sample.labels}

"""Partitions and pauses between the front door and its hosts: the door's link to a host cut
(between cells, in the middle of one) and healed, a host paused past the heartbeat that loses
it and resumed. Whatever happens, one host serves a session at a time (the door's status and
each host's own say so), no committed version is lost (the session's history), and nothing is
lost silently: the cell's reply, or a notice of the next one, says what became of it.

The hosts run without Ray (`clusters.LocalCluster`), in namespaces of their own (network, PID,
mount, UTS; the second host's monotonic clocks a day ahead), on a network the test makes and
cuts for real, where the door's link to a host and the link between two hosts (their reads of
each other's blobs) are cut apart. Where the machine cannot make namespaces, and for one test
everywhere, they run as processes of this machine, each host's server reached through a relay
the test cuts. A pause stops the server and every process under it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from clusters import LocalCluster, host_of
from cuts import Relay, paused
from helpers import text, wait_until
from namespaces import Cut, unavailable

from fabric.client import Client
from fabric.errors import RemoteError, StaleHead
from fabric.messages import Notice, Output, Reply
from fabric.snapshot import Manifest, Store
from fabric.status import HostStatus

pytest.importorskip("ray")  # the host actor finds its node's address with it (no cluster)

# runs until the file `go` appears in its working directory, then sets `late`
WAITING = ("import os, time\nopen('started', 'w').close()\n"
           "while not os.path.exists('go'):\n    time.sleep(0.05)\nlate = 'from the cut side'")
DAY = 86400  # seconds the second host's clocks run ahead, where it has namespaces of its own
LOST = 90  # seconds within which the door loses a silent host (MISSES pings and their timeouts)


HOSTS = "plain" if unavailable() else "namespaced"  # what every test runs on


@pytest.fixture(scope="module", params=[HOSTS])
def cluster(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    namespaced = request.param == "namespaced"
    if namespaced and (why := unavailable()):
        pytest.skip(why)
    with LocalCluster(tmp_path_factory.mktemp("partitions"), nodes=2, namespaced=namespaced,
                      ahead=(None, DAY)) as running:
        yield running


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with cluster.client() as c:
        wait_until(lambda: all(h.alive for h in c.status().hosts), "every host up", LOST)
        yield c


def run(client: Client, session: str, source: str) -> tuple[dict, str, list[Notice]]:
    """One cell: its reply's frame, its outputs as text and the notices it was sent."""
    reply, outputs, notices = {}, [], []
    events = client.execute(session, source, timeout=120)
    for message in events:
        if isinstance(message, Output):
            outputs.append(message.output)
        elif isinstance(message, Notice):
            notices.append(message)
        elif isinstance(message, Reply):
            reply = message.to_wire(events.msg_id)
    return reply, text(outputs), notices


def waiting_cell(cluster: LocalCluster, session: str, cwd: Path) -> tuple[threading.Thread, dict]:
    """`WAITING` run on a client of its own, started: its error lands in the dict."""
    result: dict = {}

    def target() -> None:
        with cluster.client() as own:
            try:
                result["reply"] = run(own, session, WAITING)
            except RemoteError as exc:
                result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    wait_until(lambda: (cwd / "started").exists(), "the waiting cell starts")
    return thread, result


def lost_mid_cell(thread: threading.Thread, result: dict) -> RemoteError:
    thread.join(LOST)
    assert not thread.is_alive(), "the cell on the lost host never ended"
    error = result.get("error")
    assert error is not None and error.kind == "host_lost", result
    return error


def not_taken_back(cluster: LocalCluster, client: Client, host: str) -> None:
    """The door, which finds the lost `host` still running (its node is there), tries to take
    it back, twice, and does not: it cannot answer."""
    tried = cluster.starts(host)

    def tried_twice() -> bool:
        assert not hosts(client)[host].alive, "a host that cannot answer was taken back"
        return cluster.starts(host) >= tried + 2

    wait_until(tried_twice, "the door tries to take the lost host back", LOST)


def hosts(client: Client) -> dict[str, HostStatus]:
    return {h.name: h for h in client.status().hosts}


def other(client: Client, host: str) -> str:
    return next(name for name in hosts(client) if name != host)


def door_lists(client: Client, session: str) -> list[str | None]:
    """The hosts the door's status lists `session` on."""
    return [s.host for s in client.status().sessions if s.session == session]


def served_once(cluster: LocalCluster, client: Client, session: str, host: str) -> None:
    """`session` is on `host` alone: in the door's status, and in each host's own."""
    assert door_lists(client, session) == [host]
    for name in hosts(client):
        assert (session in cluster.sessions_on(name)) == (name == host), name


def started(client: Client, session: str, cwd: Path) -> str:
    """Open `session` and run its first cell (x = 1); the host it runs on."""
    client.open(session, str(cwd))
    run(client, session, "x = 1")
    host = host_of(client, session)
    assert host is not None
    return host


def cut_mid_cell(cluster: LocalCluster, client: Client, session: str,
                 cwd: Path) -> tuple[str, Relay | Cut, threading.Thread, dict]:
    """`started`, then a `WAITING` cell, and its host's link to the door cut meanwhile: the
    host, its link (to heal), and the cell's thread and result."""
    host = started(client, session, cwd)
    thread, result = waiting_cell(cluster, session, cwd)
    relay = cluster.door_link(host)
    relay.cut()
    return host, relay, thread, result


def versions(client: Client, session: str) -> list[tuple[int, str]]:
    """The session's versions in its store, oldest first: each with its cell's first line."""
    return sorted((v["version"], v["first_line"])
                  for v in client.call("versions", session=session).versions)


def test_a_host_paused_past_its_heartbeat_gives_its_session_up_when_it_resumes(
        cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    host = started(client, "paused", tmp_path)
    thread, result = waiting_cell(cluster, "paused", tmp_path)
    worker = cluster.outer_pid(  # its host's pid, where its own PID namespace has one
        host, next(s.worker for s in client.status().sessions if s.session == "paused"))
    with paused(cluster.pid(host)) as stopped:
        assert worker in {p.pid for p in stopped}  # the server, its zygotes and workers
        with cluster.client(timeout=10) as quick:  # well before the door loses the host
            assert "paused" not in {s.session for s in quick.status().sessions}
        error = lost_mid_cell(thread, result)
        assert error.fields["version"] == 1 and "kept" in error.message
        assert not hosts(client)[host].alive
        reply, shown, _ = run(client, "paused", "z = x + 1\nprint(z)")  # the head moves on
        assert shown == "2\n" and reply["version"] == 2
        assert reply["host"] == other(client, host)
        assert door_lists(client, "paused") == [reply["host"]]
        not_taken_back(cluster, client, host)
        (tmp_path / "go").touch()  # the paused cell would end now: it must not commit
    wait_until(lambda: hosts(client)[host].alive, "the resumed host is taken back", LOST)
    served_once(cluster, client, "paused", reply["host"])
    _, shown, _ = run(client, "paused", "print(x, z, 'late' in globals())")
    assert shown == "1 2 False\n"
    assert versions(client, "paused") == [(1, "x = 1"), (2, "z = x + 1")]


def test_a_host_cut_off_between_cells_is_fenced_and_gives_its_session_up_when_healed(
        cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    host = started(client, "between", tmp_path)
    relay = cluster.door_link(host)
    relay.cut()
    try:
        wait_until(lambda: not hosts(client)[host].alive, "the cut-off host is lost", LOST)
        not_taken_back(cluster, client, host)
        reply, shown, _ = run(client, "between", "x += 1\nprint(x)")
        assert shown == "2\n" and reply["version"] == 2
        moved_to = reply["host"]
        assert moved_to == other(client, host)
        assert door_lists(client, "between") == [moved_to]
        # the cut-off host cannot tell it was lost: its store still has the session at version
        # 1, and a commit built on it is refused by the head's compare-and-set on the remote
        stale = Store(cluster.store(host), remote=cluster.remote)
        with pytest.raises(StaleHead, match="nothing was overwritten"):
            stale.set_head("between", _manifest_on(stale, "between"), stale.head("between"))
    finally:
        relay.heal()
    wait_until(lambda: hosts(client)[host].alive, "the healed host is taken back", LOST)
    served_once(cluster, client, "between", moved_to)
    assert versions(client, "between") == [(1, "x = 1"), (2, "x += 1")]


@pytest.mark.parametrize("cluster", sorted({"plain", HOSTS}), indirect=True)  # relays too
def test_a_cell_cut_off_mid_run_is_kept_where_it_committed_and_the_next_cell_says_so(
        cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    host, relay, thread, result = cut_mid_cell(cluster, client, "midcell", tmp_path)
    try:
        error = lost_mid_cell(thread, result)
        assert error.fields["version"] == 1
        # the cell runs on where it was cut off, and commits: its host reaches the remote
        (tmp_path / "go").touch()
        there = Store(cluster.store(host))
        wait_until(lambda: _version(there, "midcell") == 2, "the cut-off cell commits")
        reply, shown, notices = run(client, "midcell", "print(late)")
        assert shown == "from the cut side\n" and reply["version"] == 2
        assert reply["host"] == other(client, host)
        kept = [n.text for n in notices if n.topic == "kept"]
        assert kept and f"version 2 of session midcell, which host {host} committed" in kept[0]
    finally:
        relay.heal()
    wait_until(lambda: hosts(client)[host].alive, "the healed host is taken back", LOST)
    served_once(cluster, client, "midcell", reply["host"])
    assert versions(client, "midcell") == [(1, "x = 1"), (2, WAITING.splitlines()[0])]


def test_a_session_opened_again_after_its_host_was_lost_tells_its_next_cell_what_was_kept(
        cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    """As a client does that reads the session's version before it runs a cell again."""
    host, relay, thread, result = cut_mid_cell(cluster, client, "reopened", tmp_path)
    try:
        lost_mid_cell(thread, result)
        (tmp_path / "go").touch()
        wait_until(lambda: _version(Store(cluster.store(host)), "reopened") == 2,
                   "the cut-off cell commits")
        assert client.open("reopened", str(tmp_path)).version == 2
        _, shown, notices = run(client, "reopened", "print(late)")
        assert shown == "from the cut side\n"
        kept = [n.text for n in notices if n.topic == "kept"]
        assert kept and f"version 2 of session reopened, which host {host} committed" in kept[0]
    finally:
        relay.heal()
    wait_until(lambda: hosts(client)[host].alive, "the healed host is taken back", LOST)


def test_a_commit_on_a_moved_session_by_its_cut_off_host_refuses_the_new_hosts_next(
        cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    host, relay, thread, result = cut_mid_cell(cluster, client, "raced", tmp_path)
    try:
        lost_mid_cell(thread, result)
        reply, shown, _ = run(client, "raced", "print(x)")  # open elsewhere, on version 1
        moved_to = reply["host"]
        assert shown == "1\n" and moved_to == other(client, host) and reply["version"] == 1
        (tmp_path / "go").touch()  # and now the cut-off host commits version 2 first
        wait_until(lambda: _version(Store(cluster.store(host)), "raced") == 2,
                   "the cut-off cell commits")
        # the new host's commit on version 1 is refused by the remote's compare-and-set, and
        # the session goes on from the version the cut-off host committed
        with pytest.raises(RemoteError) as refused:
            run(client, "raced", "w = 'on the new host'")
        assert refused.value.kind == "stale", refused.value.message
        assert "nothing was overwritten" in refused.value.message
        assert "goes on from version 2" in refused.value.message
        reply, shown, _ = run(client, "raced", "print(late, 'w' in globals())\nv = 3")
        assert shown == "from the cut side False\n" and reply["version"] == 3
        assert reply["host"] == moved_to
    finally:
        relay.heal()
    wait_until(lambda: hosts(client)[host].alive, "the healed host is taken back", LOST)
    served_once(cluster, client, "raced", moved_to)
    assert versions(client, "raced") == [(1, "x = 1"), (2, WAITING.splitlines()[0]),
                                         (3, "print(late, 'w' in globals())")]


def _version(store: Store, session: str) -> int:
    head = store.head(session)
    return Manifest.decode(store.get_manifest(head)).version if head else 0


def _manifest_on(store: Store, session: str) -> str:
    """A new version of `session` on its head as `store` has it (a stale one, there)."""
    parent = Manifest.decode(store.get_manifest(store.head(session)))
    child = replace(parent, version=parent.version + 1, parent=store.head(session))
    return store.put_manifest(child.encode())


def test_hosts_cut_off_from_each_other_read_what_they_lack_from_the_remote(
        cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    if cluster.network is None:
        pytest.skip("only hosts in namespaces of their own have a link between them to cut")
    host = started(client, "apart", tmp_path)
    run(client, "apart", "y = list(range(100_000))")
    moved_to = other(client, host)
    log = cluster.config.store / "hosts" / moved_to / "serve.log"
    logged = log.stat().st_size
    link = cluster.peer_link(host, moved_to)
    link.cut()
    try:
        drained = client.call("drain", host=host)
        assert [(m.session, m.to) for m in drained.moved] == [("apart", moved_to)]
        reply, shown, _ = run(client, "apart", "print(x, len(y))")
        assert shown == "1 100000\n" and reply["host"] == moved_to and reply["version"] == 2
        with log.open("rb") as written:  # it asked its peer first, across the cut
            written.seek(logged)
            assert f"peer {host} cannot".encode() in written.read()
    finally:
        link.heal()
        client.call("drain", host=host, undo=True)
    served_once(cluster, client, "apart", moved_to)
    assert versions(client, "apart") == [(1, "x = 1"), (2, "y = list(range(100_000))")]

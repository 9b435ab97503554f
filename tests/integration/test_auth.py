"""Who may use a server: CURVE keys on tcp://, the OS user on ipc://, each user's own sessions,
per-user limits, and directories no other user can have prepared."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
import zmq
from helpers import RunningServer, execute, free_port, keyed_serving, serving, text
from nbformat.v4 import new_code_cell, new_notebook

from fabric.auth import ClientKey, Keys, write_client_key
from fabric.client import Client
from fabric.errors import BadKey, Forbidden, RemoteError, UnsafePath
from fabric.messages import Execute, Output
from fabric.private import open_private, private_dir

ROOT = Path(__file__).resolve().parents[2]
LLFABRIC = [sys.executable, "-m", "cli.main"]


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("keys")
    keys = Keys(root)
    write_client_key(root / "client.key", keys.new_client("alice"))  # the server's own check
    return root


TCP = {"keep_warm": 0, "user_sessions": 3, "user_cells": 1, "user_bytes": 1 << 20}


@pytest.fixture(scope="module")
def tcp(key_dir: Path, tmp_path_factory: pytest.TempPathFactory,
        ) -> Iterator[tuple[RunningServer, Keys]]:
    with keyed_serving(tmp_path_factory.mktemp("store"), key_dir, **TCP) as server:
        yield server, Keys(key_dir)


@pytest.fixture(scope="module")
def other_user() -> Iterator[tuple[int, int]]:
    """A real second OS user, (uid, gid): only root can make one."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("a second OS user needs root and useradd to create")
    name = f"llft{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=True)
    try:
        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], check=False)


def _as(user: tuple[int, int], command: str) -> None:
    subprocess.run(["sh", "-c", command], user=user[0], group=user[1], extra_groups=[],
                   cwd="/", check=True, timeout=60)


def _client(server: RunningServer, key: ClientKey, timeout: float = 30) -> Client:
    return Client(server.address, timeout=timeout, key=key)


@pytest.fixture(scope="module")
def users(tcp: tuple[RunningServer, Keys]) -> dict[str, ClientKey]:
    _, keys = tcp
    return {name: keys.new_client(name) for name in ("bob", "carol", "dave", "erin")}


def test_tcp_without_client_keys_is_refused_at_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [*LLFABRIC, "serve", "--store", str(tmp_path / "store"),
         "--bind", f"tcp://127.0.0.1:{free_port()}"], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env={**os.environ, "LLFABRIC_KEY_DIR": str(tmp_path / "keys")})
    assert result.returncode != 0
    assert "llfabric keys new" in result.stderr
    assert (tmp_path / "keys" / "server.key").stat().st_mode & 0o777 == 0o600


def test_a_client_with_an_admitted_key_is_served_as_its_user(tcp, users) -> None:
    server, _ = tcp
    with _client(server, users["bob"]) as bob:
        assert bob.call("ping").user == "bob"


def test_unknown_keys_and_plain_clients_get_no_service(tcp, users) -> None:
    server, keys = tcp
    public, secret = zmq.curve_keypair()
    stranger = ClientKey("eve", public.decode(), secret.decode(), keys.server_pair()[0])
    with _client(server, stranger) as client, pytest.raises(Forbidden):
        client.ping(timeout=2)  # told so, not taken for a server that does not answer
    plain = zmq.Context.instance().socket(zmq.DEALER)  # no CURVE: what a stdlib script speaks
    plain.linger = 0
    plain.connect(server.address)
    try:
        plain.send(b"\x83\xa2op\xa7execute\xa6msg_id\xa11\xa7session\xa1s")
        assert not plain.poll(2000)
    finally:
        plain.close()


def test_a_user_sees_and_runs_only_their_own_sessions(tcp, users, tmp_path: Path) -> None:
    server, _ = tcp
    name = f"nb-{uuid.uuid4().hex[:6]}"
    with _client(server, users["bob"]) as bob, _client(server, users["carol"]) as carol:
        bob.call("open", session=name, cwd=str(tmp_path))
        execute(bob, name, "secret = 'bob only'")
        for op, fields in [("execute", {"source": "print(secret)"}), ("draft", {"source": "1"}),
                           ("checkout", {"version": 1}), ("interrupt", {}), ("close", {})]:
            with pytest.raises(RemoteError) as err:
                carol.call(op, session=name, **fields)
            assert err.value.kind == "unknown_session", op
        assert name not in [s.session for s in carol.status().sessions]
        # the same name is carol's own session, which never saw bob's state
        assert carol.call("open", session=name, cwd=str(tmp_path)).version == 0
        _, outputs = execute(carol, name, "print('secret' in dir())")
        assert text(outputs) == "False\n"
        _, outputs = execute(bob, name, "print(secret)")
        assert text(outputs) == "bob only\n"
        assert [s.session for s in bob.status().sessions] == [name]
        for who in (bob, carol):
            who.call("close", session=name)


def test_only_the_hosts_owner_moves_a_users_worker_or_closes_its_sessions(
        tcp, users, tmp_path: Path) -> None:
    server, _ = tcp
    name = f"nb-{uuid.uuid4().hex[:6]}"
    image = {"files": [], "init": False, "parked": False, "device": None, "base": None,
             "holds": [], "unsaved": []}
    with _client(server, users["bob"]) as bob, _client(server, users["carol"]) as carol:
        bob.call("open", session=name, cwd=str(tmp_path))
        execute(bob, name, "numbers = (i for i in range(3))")  # pinned: only its worker has it
        for who in (bob, carol):
            assert who.call("ping").wake_dir is None  # where carried workers wake: the door's
            for op, fields in [("emigrate", {"wake_dir": str(tmp_path)}),
                               ("immigrate", {"image": image})]:
                with pytest.raises(RemoteError) as err:
                    who.call(op, session=name, user="bob", **fields)
                assert err.value.kind == "forbidden", op
            with pytest.raises(RemoteError) as err:  # nor closes every session of the host
                who.call("give_up")
            assert err.value.kind == "forbidden"
        _, outputs = execute(bob, name, "print(next(numbers))")  # neither dumped nor replaced
        assert text(outputs) == "0\n"
        bob.call("close", session=name)


def test_a_revoked_key_is_refused_at_once(tcp, users) -> None:
    server, keys = tcp
    with _client(server, users["dave"]) as dave:
        assert dave.call("ping").user == "dave"
        assert keys.revoke("dave")
        with pytest.raises(RemoteError) as err:
            dave.call("ping")
        assert err.value.kind == "forbidden"


def test_per_user_limits_on_sessions_and_running_cells(tcp, users, tmp_path: Path) -> None:
    server, _ = tcp
    with _client(server, users["carol"]) as carol:
        names = [f"lim-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
        for name in names[:3]:
            carol.call("open", session=name, cwd=str(tmp_path))
        with pytest.raises(RemoteError) as err:
            carol.call("open", session=names[3], cwd=str(tmp_path))
        assert err.value.kind == "limit"
        # one cell at a time: a second, while the first runs, is refused
        first = carol.send(Execute(session=names[0],
                                   source="print('go', flush=True)\nimport time\ntime.sleep(3)"))
        assert carol.receive({first}, 60)["event"] in ("output", "queued", "leased")
        with pytest.raises(RemoteError) as err:
            carol.call("execute", session=names[1], source="1")
        assert err.value.kind == "limit"
        while carol.receive({first}, 60)["type"] != "reply":
            pass
        assert carol.call("execute", session=names[1], source="1").status == "ok"
        for name in names[:3]:
            carol.call("close", session=name)


def _client_as(user: tuple[int, int], address: str) -> list[str]:
    """What a client running as `user` learns: its user name, its sessions, and what an
    execute in the session 'mine' gets. A forked child (this Python may sit where that user
    cannot read), which drops to the user before it opens any socket."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
            with Client(address, timeout=30) as client:
                seen = [client.call("ping").user,
                        str([s.session for s in client.status().sessions])]
                try:
                    client.call("execute", session="mine", source="print(x)")
                except RemoteError as exc:
                    seen.append(exc.kind)
            os.write(write, "\n".join(seen).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        seen = f.read().split("\n")
    assert os.waitpid(pid, 0)[1] == 0
    return seen


def test_an_ipc_client_is_the_os_user_it_connects_as(other_user, tmp_path: Path) -> None:
    shared = Path(tempfile.mkdtemp(prefix="llf-", dir="/tmp"))  # the admin's shared socket dir
    try:
        shared.chmod(0o755)
        with serving(tmp_path / "store", bind=f"ipc://{shared}/s.sock") as server:
            (shared / "s.sock").chmod(0o666)  # the admin lets other local users connect
            with server.client() as me:
                assert me.call("ping").user == pwd.getpwuid(os.geteuid()).pw_name
                me.call("open", session="mine", cwd=str(tmp_path))
                execute(me, "mine", "x = 'root only'")
                assert _client_as(other_user, server.address) == [
                    pwd.getpwuid(other_user[0]).pw_name, "[]", "unknown_session"]
                assert [s.session for s in me.status().sessions] == ["mine"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture
def hostile_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A runtime dir made first, mode 0777, its log a link to a file of ours: by another OS
    user when the test runs as root, else by this user."""
    path = Path(f"/tmp/llf-hostile-{uuid.uuid4().hex[:8]}")
    command = (f"mkdir -m 777 {path} && ln -s {tmp_path / 'precious'} "
               f"{path / 'embedded-server.log'}")
    try:
        if request.param == "other user":
            _as(request.getfixturevalue("other_user"), command)
        else:
            subprocess.run(["sh", "-c", command], check=True)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("hostile_dir", ["other user", "this user"], indirect=True)
def test_a_runtime_dir_others_could_prepare_is_refused(hostile_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "precious").write_text("keep\n")
    nb = tmp_path / "nb.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print('secret source')")]), str(nb))
    result = subprocess.run(
        [*LLFABRIC, "run", str(nb), "--store", str(tmp_path / "store")], cwd=ROOT,
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "LLFABRIC_RUNTIME_DIR": str(hostile_dir)})
    assert result.returncode != 0
    assert f"refusing {hostile_dir}" in result.stderr
    assert (tmp_path / "precious").read_text() == "keep\n"
    assert not (hostile_dir / "server.sock").exists()


def test_a_store_others_can_write_into_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir(mode=0o777)
    store.chmod(0o777)
    result = subprocess.run([*LLFABRIC, "serve", "--store", str(store), "--bind",
                             f"ipc://{tmp_path}/s.sock"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert f"refusing {store}" in result.stderr and "lets other users in" in result.stderr


def test_private_dirs_are_made_0700_and_a_link_is_never_followed(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "a" / "b")
    assert made.stat().st_mode & 0o777 == 0o700
    (tmp_path / "target").write_text("x")
    (made / "log").symlink_to(tmp_path / "target")
    with pytest.raises(UnsafePath):
        open_private(made / "log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    (tmp_path / "link").symlink_to(made)  # a link of ours leads to a directory checked too
    assert private_dir(tmp_path / "link") == tmp_path / "link"
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "link-to-open").symlink_to(tmp_path / "open")
    with pytest.raises(UnsafePath):
        private_dir(tmp_path / "link-to-open")


def test_a_user_past_their_stored_bytes_commits_no_more(tcp, users, tmp_path: Path) -> None:
    server, _ = tcp
    with _client(server, users["erin"]) as erin, _client(server, users["bob"]) as bob:
        erin.call("open", session="big", cwd=str(tmp_path))
        assert execute(erin, "big", "data = bytes(600 << 10)")[0]["status"] == "ok"
        erin.call("close", session="big")  # closed, its state is still hers in the store
        erin.call("open", session="next", cwd=str(tmp_path))
        with pytest.raises(RemoteError) as err:  # the commit, not the disk, refuses it
            erin.call("execute", session="next", source="more = bytes(600 << 10)")
        assert err.value.kind == "limit" and "would store" in err.value.message
        assert erin.status().sessions[0].version == 0  # nothing was committed
        bob.call("open", session="small", cwd=str(tmp_path))  # the limit is erin's alone
        assert bob.call("execute", session="small", source="1").status == "ok"
        bob.call("close", session="small")
        erin.call("close", session="next")


def _cli(*args: str, key_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*LLFABRIC, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "LLFABRIC_KEY_DIR": str(key_dir)})


def test_keys_are_made_listed_and_revoked_and_run_uses_the_configured_one(
        tcp, key_dir: Path, tmp_path: Path) -> None:
    server, _ = tcp
    nb = tmp_path / "remote.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(6 * 7)")]), str(nb))
    result = _cli("run", str(nb), "--connect", server.address, key_dir=key_dir)  # alice's key
    assert result.returncode == 0, result.stderr
    assert "42" in result.stdout
    keyless = _cli("run", str(nb), "--connect", server.address, key_dir=tmp_path / "none")
    assert keyless.returncode != 0 and "llfabric keys new" in keyless.stderr

    out = tmp_path / "frank.key"
    assert _cli("keys", "new", "frank", "--out", str(out), key_dir=key_dir).returncode == 0
    assert out.stat().st_mode & 0o777 == 0o600
    assert "frank " in _cli("keys", "list", key_dir=key_dir).stdout
    with Client(server.address, key=Keys.client_from(out)) as frank:
        assert frank.call("ping").user == "frank"
    assert _cli("keys", "new", "frank", "--out", str(tmp_path / "again.key"),
                key_dir=key_dir).returncode != 0  # one key per user
    assert _cli("keys", "revoke", "frank", key_dir=key_dir).returncode == 0
    assert "frank " not in _cli("keys", "list", key_dir=key_dir).stdout
    assert _cli("keys", "revoke", "frank", key_dir=key_dir).returncode != 0


def test_a_revoke_stops_the_users_running_cell(tcp, tmp_path: Path) -> None:
    server, keys = tcp
    with _client(server, keys.new_client("gina"), timeout=60) as gina:
        name = f"g-{uuid.uuid4().hex[:8]}"
        gina.call("open", session=name, cwd=str(tmp_path))
        forever = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.1)\n"
        events = gina.execute(name, forever, timeout=60)
        next(m for m in events if isinstance(m, Output))  # it runs
        assert keys.revoke("gina")
        revoked = time.monotonic()
        with pytest.raises(RemoteError) as stopped:
            for _ in events:  # its outputs stop: the cell is stopped, uncommitted
                assert time.monotonic() - revoked < 60, "the cell ran on after the revoke"
    assert stopped.value.kind == "stopped" and "revoked" in stopped.value.message
    with _client(server, keys.new_client("gina")) as again:  # a new key: nothing of it runs
        assert again.status().leases.held == 0


def test_a_refused_key_and_a_wrong_server_key_are_told_at_once(tcp, tmp_path: Path) -> None:
    server, keys = tcp
    hugo = keys.new_client("hugo")
    assert keys.revoke("hugo")
    with _client(server, hugo) as client, pytest.raises(Forbidden) as refused:
        client.call("ping")
    assert "revoked or never admitted" in refused.value.message
    other, _ = zmq.curve_keypair()
    alice = keys.client()  # an admitted pair, with another server's key
    wrong = ClientKey(alice.user, alice.public, alice.secret, other.decode())
    with _client(server, wrong) as client, pytest.raises(BadKey) as mismatch:
        client.call("ping")
    assert "not the server key" in mismatch.value.message

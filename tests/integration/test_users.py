"""A host serving several users (`users = "separate"`): two real OS users, each client connecting
as its own user over ipc://; each user's cells run as that user, and one user's cell reaches
nothing of the other's: blobs, manifests, working files, the store's key, worker, sessions."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import RunningServer, execute, require_criu, serving, text

from fabric import users
from fabric.auth import Keys, write_client_key
from fabric.client import Client
from fabric.errors import RemoteError
from fabric.worker import threads

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def os_users(count: int) -> Iterator[list[pwd.struct_passwd]]:
    """`count` real OS users with homes closed to others, removed after the block: only root
    can make them (skips otherwise)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("OS users need root and useradd to create")
    names = [f"llfu{uuid.uuid4().hex[:8]}" for _ in range(count)]
    opened: dict[Path, int] = {}
    try:
        for name in names:
            subprocess.run(["useradd", "-m", "-s", "/usr/sbin/nologin", name], check=True)
            os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
        users = [pwd.getpwnam(name) for name in names]
        _open_for_passing(opened)
        _require_readable_python(users[0])
        yield users
    finally:
        for name in names:
            subprocess.run(["userdel", "-r", name], check=False, capture_output=True)
        for folder, mode in opened.items():
            folder.chmod(mode)


@pytest.fixture(scope="module")
def two_users() -> Iterator[list[pwd.struct_passwd]]:
    with os_users(2) as users:
        yield users


def _open_for_passing(opened: dict[Path, int]) -> None:
    """Let other users pass through (o+x, never o+r) the folders above this Python and the
    checkout that they could not, as CI's pyenv under a 0700 /root: a shared host installs
    llfabric where every user can read it. Each folder's mode before, into `opened`."""
    found = [Path(sys.executable).resolve(), ROOT, Path(sys.prefix).resolve(),
             Path(sys.base_prefix).resolve(),
             *(Path(p).resolve() for p in sys.path if p and Path(p).is_dir())]
    for path in found:
        for folder in (path if path.is_dir() else path.parent, *path.parents):
            mode = stat.S_IMODE(folder.stat().st_mode)
            if folder not in opened and not mode & stat.S_IXOTH:
                opened[folder] = mode
                folder.chmod(mode | stat.S_IXOTH)


def _require_readable_python(user: pwd.struct_passwd) -> None:
    """A worker dropped to a user imports what its cells need as that user: skip where this
    Python or the checkout is still closed to other users (folders they cannot read)."""
    probe = "import html, fabric.worker.runner"
    try:
        ok = subprocess.run([sys.executable, "-c", probe], user=user.pw_uid, group=user.pw_gid,
                            extra_groups=[], cwd="/", capture_output=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode == 0
    except PermissionError:
        ok = False
    if not ok:
        pytest.skip(f"other users cannot run this Python ({sys.executable}) or read {ROOT}: a "
                    "shared host installs llfabric where every user can read it")


SERVER_ONLY = {"AWS_SECRET_ACCESS_KEY": "server-secret", "TEAM": "ops"}  # the operator's own
SERVER_ENV = {**SERVER_ONLY, "SITE_PROXY": "http://proxy:3128"}
SHARED_HOST = {"worker_env": "SITE_PROXY TEAM=ml"}  # SITE_PROXY passed on, TEAM set


@contextlib.contextmanager
def serving_users(store: Path, env: dict[str, str] | None = None,
                  **settings: object) -> Iterator[RunningServer]:
    """`serving` for several users (`users = "separate"`) on `store`, its socket in a folder
    the admin lets local users reach."""
    shared = Path(tempfile.mkdtemp(prefix="llf-", dir="/tmp"))
    try:
        shared.chmod(0o755)
        with serving(store, env, bind=f"ipc://{shared}/s.sock", users="separate",
                     **settings) as running:
            (shared / "s.sock").chmod(0o666)
            yield running
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture(scope="module")
def server(two_users) -> Iterator[RunningServer]:
    store = Path(tempfile.mkdtemp(prefix="llf-store-", dir="/tmp"))
    try:
        with serving_users(store, {**os.environ, **SERVER_ENV}, **SHARED_HOST) as running:
            yield running
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _as(user: pwd.struct_passwd, address: str, calls: Callable[[Client], object]) -> object:
    """What `calls` returns in a client running as `user` (a forked child that drops to the
    user before it opens any socket), as JSON; a RemoteError as its kind."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            with Client(address, timeout=60) as client:
                try:
                    result = calls(client)
                except RemoteError as exc:
                    result = {"error": exc.kind}
            os.write(write, json.dumps(result).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    assert os.waitpid(pid, 0)[1] == 0
    return json.loads(out)


def _cell(session: str, source: str) -> Callable[[Client], object]:
    def calls(client: Client) -> object:
        client.call("open", session=session)
        reply, outputs = execute(client, session, source)
        return {"status": reply["status"], "text": text(outputs)}
    return calls


ATTACK = r"""
import ctypes, json, os, signal
tried = {}
def attempt(what, action):
    try:
        action()
        tried[what] = "done"
    except OSError as exc:
        tried[what] = type(exc).__name__
for what, path in PATHS.items():
    attempt(what, lambda path=path: open(path, "rb").read())
attempt("list blobs", lambda: os.listdir(BLOBS))
attempt("signal", lambda: os.kill(PID, signal.SIGTERM))
libc = ctypes.CDLL(None, use_errno=True)
def trace():
    if libc.ptrace(16, PID, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
attempt("ptrace", trace)
print(json.dumps(tried))
"""


def test_each_users_cells_run_as_them_and_reach_nothing_of_anothers(
        two_users, server: RunningServer) -> None:
    alice, bob = two_users
    ran = _as(alice, server.address, _cell(
        "analysis", "import os\nsecret = 'only alice'\nopen('notes.txt', 'w').write(secret)\n"
                    "print(os.getuid(), os.getgid(), os.getpid(), os.getcwd())"))
    assert ran["status"] == "ok", ran
    uid, gid, pid, cwd = ran["text"].split()
    assert (int(uid), int(gid), cwd) == (alice.pw_uid, alice.pw_gid, alice.pw_dir)

    part = server.store / "users" / alice.pw_name
    blobs = [p for p in (part / "blobs").rglob("*") if p.is_file()]
    manifests = list((part / "manifests").iterdir())
    assert blobs and manifests
    assert {p.stat().st_uid for p in blobs} == {alice.pw_uid}  # her worker wrote them
    paths = {"blob": str(blobs[0]), "manifest": str(manifests[0]),
             "key": str(server.store / "key"), "working file": f"{alice.pw_dir}/notes.txt",
             "memory": f"/proc/{pid}/mem"}
    attack = f"PATHS = {paths!r}\nBLOBS = {str(part / 'blobs')!r}\nPID = {pid}\n" + ATTACK
    tried = _as(bob, server.address, _cell("analysis", attack))
    assert tried["status"] == "ok", tried
    assert json.loads(tried["text"]) == {
        "blob": "PermissionError", "manifest": "PermissionError", "key": "PermissionError",
        "working file": "PermissionError", "memory": "PermissionError",
        "list blobs": "PermissionError", "signal": "PermissionError", "ptrace": "PermissionError"}

    def status(client: Client) -> object:
        seen = client.status()
        return {"sessions": [(s.session, s.version) for s in seen.sessions],
                "names her": alice.pw_name in json.dumps(seen.to_map())}

    assert _as(bob, server.address, status) == {"sessions": [["analysis", 1]],
                                                 "names her": False}

    def work_in_hers(client: Client) -> object:
        client.call("open", session="hers", cwd=alice.pw_dir)
        execute(client, "hers", "import os\nprint(os.listdir())")
        return "entered"

    assert _as(bob, server.address, work_in_hers) == {"error": "load"}  # never entered
    # her session is untouched: the same worker, her value, her file
    again = _as(alice, server.address, _cell(
        "analysis", "import os\nprint(secret, os.getpid(), open('notes.txt').read())"))
    assert again["text"].split() == ["only", "alice", pid, "only", "alice"]


def test_a_users_cells_see_what_the_operator_lists_and_nothing_else_of_the_servers(
        two_users, server: RunningServer) -> None:
    alice = two_users[0]
    seen = _as(alice, server.address, _cell(
        "environ", "import json, os\nprint(json.dumps(dict(os.environ)))"))
    assert seen["status"] == "ok", seen
    environ = json.loads(seen["text"])
    assert "AWS_SECRET_ACCESS_KEY" not in environ
    assert (environ["SITE_PROXY"], environ["TEAM"]) == ("http://proxy:3128", "ml")  # listed
    assert (environ["HOME"], environ["USER"]) == (alice.pw_dir, alice.pw_name)
    ours = {"PATH", "LANG", "PYTHONPATH", "SITE_PROXY", *threads.environ(1), *SERVER_ONLY,
            "MPLBACKEND"}  # the worker's shell sets it, as an earlier in-process test may have
    assert {k for k, v in os.environ.items() if environ.get(k) == v} - ours == set()


def test_a_user_without_an_os_account_or_root_runs_nothing(server: RunningServer) -> None:
    with server.client() as root:
        with pytest.raises(RemoteError) as refused:
            root.call("open", session="mine")
        assert refused.value.kind == "forbidden"


def test_environments_are_refused_where_each_user_runs_as_themselves(
        two_users, server: RunningServer) -> None:
    """An environment's packages are their user's to write, and zygotes, the server's, would
    import them before any worker becomes that user: such a session is refused, not opened."""
    def open_in_env(client: Client) -> object:
        client.call("open", session="in-env", env="mine")
        return "opened"

    assert _as(two_users[0], server.address, open_in_env) == {"error": "env"}


def test_a_template_copy_runs_as_its_user_too(two_users) -> None:
    """A template's copy (a dormant worker CRIU-dumped as the server's user) becomes the user
    before anything of the session reaches it, as a fork does."""
    require_criu("templates")
    alice = two_users[0]
    store = Path(tempfile.mkdtemp(prefix="llf-store-", dir="/tmp"))
    shared = Path(tempfile.mkdtemp(prefix="llf-", dir="/tmp"))

    def cells(client: Client) -> object:
        seen = []
        for i in range(30):  # fresh sessions until one's worker is a template's copy
            client.call("open", session=f"s{i}")
            seen.append(_run(client, f"s{i}", "import os\nprint(os.getuid(), os.getcwd())"))
            if seen[-1][0] == "template":
                break
            time.sleep(1)
        return seen

    try:
        shared.chmod(0o755)
        with serving(store, bind=f"ipc://{shared}/s.sock", users="separate", keep_warm=0,
                     worker_source="template") as running:
            (shared / "s.sock").chmod(0o666)
            seen = _as(alice, running.address, cells)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    assert seen[-1] == ["template", f"{alice.pw_uid} {alice.pw_dir}\n"], seen
    assert {out for _, out in seen} == {f"{alice.pw_uid} {alice.pw_dir}\n"}, seen


def _run(client: Client, session: str, source: str) -> list[str]:
    """Where the cell's worker came from, and the cell's text output."""
    reply, outputs = execute(client, session, source)
    assert reply["status"] == "ok", text(outputs)
    return [reply["source"], text(outputs)]


def test_a_client_key_runs_cells_as_the_os_account_its_user_names(
        two_users, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over tcp://, the user a key is admitted as is the OS account of that name, whoever the
    client process runs as (here root)."""
    alice = two_users[0]
    key = Keys(tmp_path).new_client(alice.pw_name)
    write_client_key(tmp_path / "client.key", key)  # the readiness ping reads it
    monkeypatch.setenv("LLFABRIC_KEY_DIR", str(tmp_path))
    store = Path(tempfile.mkdtemp(prefix="llf-store-", dir="/tmp"))
    try:
        with serving(store, bind=f"tcp://127.0.0.1:{_port()}", users="separate") as running, \
                Client(running.address, timeout=60, key=key) as client:
            client.call("open", session="remote")
            assert _run(client, "remote", "import os\nprint(os.getuid())")[1] == \
                f"{alice.pw_uid}\n"
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_pinned_worker_cools_and_comes_back_as_its_user_or_stays_warm(two_users) -> None:
    """A pinned worker dumped to disk (cool) and restored reconnects and runs on as its user,
    with the state it kept; where CRIU cannot dump another user's process (no
    CAP_SYS_RESOURCE), it stays warm instead of being lost to a failed dump."""
    require_criu("cool workers")
    alice = two_users[0]
    store = Path(tempfile.mkdtemp(prefix="llf-store-", dir="/tmp"))
    shared = Path(tempfile.mkdtemp(prefix="llf-", dir="/tmp"))
    cools = users.dumps_others()

    def tier(client: Client) -> str:
        return next(s for s in client.status().sessions if s.session == "kept").tier

    def cells(client: Client) -> object:
        client.call("open", session="kept")
        _run(client, "kept", "pinned = (i for i in range(3))\nnext(pinned)")
        deadline = time.monotonic() + (60 if cools else 3)
        while tier(client) != "cool" and time.monotonic() < deadline:
            time.sleep(0.1)
        idle = tier(client)
        reply, outputs = execute(client, "kept", "import os\nprint(os.getuid(), next(pinned))")
        return [idle, reply["status"], reply.get("path"), text(outputs)]

    try:
        shared.chmod(0o755)
        with serving(store, bind=f"ipc://{shared}/s.sock", users="separate", keep_warm=300,
                     cool_after=1, linger=0) as running:
            (shared / "s.sock").chmod(0o666)
            seen = _as(alice, running.address, cells)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    assert seen == ["cool" if cools else "warm", "ok", "pinned", f"{alice.pw_uid} 1\n"], seen

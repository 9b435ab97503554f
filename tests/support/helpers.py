"""Small helpers shared by the server tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from fabric.client import Client
from fabric.config import Config
from fabric.embedded import EmbeddedServer
from fabric.errors import RemoteError
from fabric.messages import Output, Reply
from fabric.pool import Pool, criu
from fabric.snapshot import Group, Manifest, Store, dumps
from fabric.status import SessionStatus
from fabric.worker.messages import Done, Load, Loaded, RunCell


def execute(client: Client, session: str, source: str,
            gpus: int | None = None) -> tuple[dict, list[dict]]:
    """Run one cell (with `gpus`, on that many slots from now on); return the server's reply
    frame and the cell's outputs."""
    outputs, reply = [], {}
    events = client.execute(session, source, gpus=gpus, timeout=120)
    for message in events:
        if isinstance(message, Output):
            outputs.append(message.output)
        elif isinstance(message, Reply):
            reply = message.to_wire(events.msg_id)
    return reply, outputs


def text(outputs: list[dict]) -> str:
    """What a reader sees as text: streams and text/plain results, in order."""
    parts = []
    for out in outputs:
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(out["data"].get("text/plain", "") + "\n")
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}\n")
    return "".join(parts)


def open_session(client: Client, cwd: Path) -> str:
    """Open a new session with a unique name, working in `cwd`; return its name."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.call("open", session=name, cwd=str(cwd))
    return name


class RunningServer(EmbeddedServer):
    """A real `llfabric serve` in a subprocess, with its store in a temp dir."""

    @property
    def store(self) -> Path:
        return self.config.store

    @property
    def address(self) -> str:
        return self.config.address

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.address, timeout=timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def pid_of_running_cell(server: RunningServer, session: str) -> int:
    """The pid of the worker running `session`'s cell, once it runs."""
    with server.client() as side:
        for _ in range(200):
            info = side.status()
            running = [s for s in info.sessions if s.session == session and s.running]
            if running and info.workers:
                return running[0].worker
            time.sleep(0.05)
    raise AssertionError("the cell never started")


def execute_in_thread(server: RunningServer, session: str,
                      source: str) -> tuple[threading.Thread, dict]:
    """Run a cell on a client of its own; `reply` and `outputs`, or `error`, land in the dict."""
    result: dict = {}

    def target() -> None:
        with server.client() as c:
            try:
                result["reply"], result["outputs"] = execute(c, session, source)
            except RemoteError as exc:
                result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def start_server(store: Path, sockdir: Path, env: dict[str, str] | None = None,
                 bind: str | None = None) -> RunningServer:
    config = Config(store=store, runtime_dir=sockdir, bind=bind or f"ipc://{sockdir}/s.sock")
    server = RunningServer(config, env)
    server.start()
    return server


@contextlib.contextmanager
def serving(store: Path, env: dict[str, str] | None = None, bind: str | None = None,
            **settings: object) -> Iterator[RunningServer]:
    """A real server on `store` for the block, which must exit cleanly after it. `settings` are
    configuration keys (keep_warm=0 sets LLFABRIC_KEEP_WARM=0) on top of `env` (default: this
    process's). Its socket sits in a short private dir (ipc:// paths must fit in sun_path) unless
    `bind` names another address."""
    env = {**(os.environ if env is None else env),
           **{f"LLFABRIC_{key.upper()}": str(value) for key, value in settings.items()}}
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:
        server = start_server(store, Path(sockdir), env, bind)
        try:
            yield server
        except BaseException:  # a failure's report (a timeout's too) shows what the server did
            print(f"--- the server's log, last lines ---\n{_tail(server.log, 80)}")
            raise
        finally:
            server.stop()
            if keep := os.environ.get("LLFABRIC_KEEP_LOGS"):  # bench/device_check.sh reads them
                shutil.copy(server.log, Path(keep) / f"server-{sockdir.rsplit('-', 1)[-1]}.log")
        # its log lies in `sockdir`: read it before the directory goes
        assert server.process.returncode == 0, \
            f"the server exited with {server.process.returncode}:\n{server.log.read_text()}"


def _tail(path: Path, lines: int) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"({path} is unreadable)"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def keyed_serving(store: Path, keys_root: Path, **settings: object) -> Iterator[RunningServer]:
    """`serving` on tcp:// with the CURVE keys in `keys_root` (LLFABRIC_KEY_DIR for the block:
    the readiness ping reads its client.key)."""
    before = os.environ.get("LLFABRIC_KEY_DIR")
    os.environ["LLFABRIC_KEY_DIR"] = str(keys_root)
    try:
        with serving(store, bind=f"tcp://127.0.0.1:{free_port()}", **settings) as running:
            yield running
    finally:
        if before is None:
            del os.environ["LLFABRIC_KEY_DIR"]
        else:
            os.environ["LLFABRIC_KEY_DIR"] = before


@contextlib.contextmanager
def small_disk(size: str = "48m") -> Iterator[Path]:
    """A tmpfs of `size` of its own, where writes fail as on a full disk: only root can mount
    one (skips otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    path = Path(tempfile.mkdtemp(prefix="llf-full-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                              str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        path.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


def printing_cell(lines: int) -> str:
    """A cell that touches `started` in its working directory, prints a line every 0.2 s, then
    sets `done`: one that runs long enough for a test to act while it runs."""
    return (f"import time\nopen('started', 'w').close()\nfor i in range({lines}):\n"
            "    print('line', i, flush=True)\n    time.sleep(0.2)\ndone = 'yes'\n")


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Poll `predicate` until it holds; fail saying `what` did not happen in time."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.1)


def hold_a_slot(server: RunningServer, seconds: float) -> threading.Thread:
    """Another session's cell holding an execution slot for `seconds`, already running (its
    zygote warmed first, so it starts at once): join the thread when done."""
    other = f"o-{uuid.uuid4().hex[:8]}"
    with server.client() as client:
        client.call("open", session=other, cwd=tempfile.gettempdir())
        execute(client, other, "1")
    started = threading.Event()

    def hold() -> None:
        with server.client() as client:
            for message in client.execute(other, "import time\nprint('go', flush=True)\n"
                                                 f"time.sleep({seconds})", timeout=60):
                if isinstance(message, Output):
                    started.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert started.wait(60), "the slot-holding cell did not start"
    return holder


def require_criu(what: str) -> None:
    """Skip when CRIU cannot run here; under CI, which provisions it, fail instead."""
    if why := criu.unavailable():
        if os.environ.get("CI"):
            pytest.fail(f"{what} cannot work here: {why}", pytrace=False)
        pytest.skip(f"{what} cannot work here: {why}")


def commit_values(store: Store, session: str, **values: object) -> str:
    """Commit a version holding `values` (each its own group) on top of the session's head."""
    head = store.head(session)
    parent = Manifest.decode(store.get_manifest(head)) if head else None
    groups = tuple(Group(store.put_object(dumps({k: v}, {})), (k,), 1) for k, v in values.items())
    manifest = Manifest(session=session, version=parent.version + 1 if parent else 1,
                        parent=head, groups=groups, ambient=store.put(b"ambient"),
                        cell={"execution_count": 1, "status": "ok", "source": "x"})
    ident = store.put_manifest(manifest.encode())
    store.set_head(session, ident, head)
    return ident


# A notebook's own import hook: `import txt_NAME` reads NAME.txt of the working directory,
# through globals of the session (SUFFIX, text_path, os) that no importing cell names.
IMPORT_HOOK = """import importlib.abc, importlib.util, os, sys
SUFFIX = '.txt'

def text_path(name):
    return name.rsplit('.', 1)[-1] + SUFFIX

class TextFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.startswith('txt_') and os.path.exists(text_path(name[4:])):
            return importlib.util.spec_from_loader(name, self)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.text = open(text_path(module.__name__[4:])).read().strip()

sys.meta_path.append(TextFinder())
"""


def session_status(client: Client, session: str) -> SessionStatus:
    """The session's entry in the server's status."""
    return next(s for s in client.status().sessions if s.session == session)


@contextlib.contextmanager
def holding_pid(pid: int) -> Iterator[subprocess.Popen]:
    """A process of this host under `pid`, made so by setting the last pid handed out (root).
    On a busy host another process may fork first and take it: it is tried again once that
    process is gone."""
    for _ in range(50):
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), f"pid {pid} being free")
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(pid - 1))
        holder = subprocess.Popen(["sleep", "600"])
        if holder.pid == pid:
            break
        holder.kill()
        holder.wait()
    else:
        pytest.fail(f"could not take pid {pid}")
    try:
        yield holder
    finally:
        holder.kill()
        holder.wait()


def lazy_package(root: Path, name: str, imports: str = "") -> None:
    """Package `name` under `root`: it imports `imports` at once, and its submodule `part`
    only when its `use()` is first called, as libraries import parts of themselves."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(
        (f"import {imports}\n" if imports else "")
        + "def use():\n    from . import part\n    return part.VALUE\n")
    (root / name / "part.py").write_text("VALUE = 42\n")


def cells_on_one_worker(root: Path, cells: list[str], groups: Sequence[tuple[str, list[str]]] = (),
                        timeout: float = 60) -> list[Done]:
    """Each of `cells` run in turn on one worker forked by a pool whose store is `root`, working
    there, with the store's `groups` (blob, names) loaded first: what each cell's `Done` said."""
    async def scenario() -> list[Done]:
        pool = Pool(root)
        await pool.start()
        try:
            worker = await pool.fork_worker(frozenset())
            await worker.send(Load(cwd=str(root), groups=list(groups)))
            loaded = await worker.recv(timeout=timeout)
            assert isinstance(loaded, Loaded) and loaded.error is None, loaded
            dones = []
            for count, cell in enumerate(cells, 1):
                await worker.send(RunCell(cell, execution_count=count))
                while not isinstance(done := await worker.recv(timeout=timeout), Done):
                    pass
                dones.append(done)
            await worker.close()
            return dones
        finally:
            await pool.stop()

    return asyncio.run(scenario())

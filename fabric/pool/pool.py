"""The server's side of zygotes and workers: a tree of import-family zygotes, forked workers.

Runs inside the server's asyncio loop. Each zygote's control socket is watched with
`add_reader`; replies resolve futures, and `exited` reports end the matching worker.

Worker sources degrade, never fail a cell on their own: a template restore that fails falls
back to a zygote fork, a fork that fails (no zygote ready, one dying) to a cold worker, a plain
fresh process. A dead zygote is dropped, its family rebuilt when next needed; a dead base zygote
is reaped and restarted in the background, cells starting cold meanwhile.

Zygotes and templates are kept per (environment, import family), an environment named by its
site-packages ("" for the server's own). An environment's root zygote is forked from the base
zygote (the worker runtime, shared by all) and enters the environment; its families fork from
it. When an environment changes (a package installed), its zygotes and templates retire, so
later workers import what it holds now; a retired zygote that still has live workers is kept
until they end (they die with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import psutil
import zmq
import zmq.asyncio

from .. import protocol
from ..errors import (
    ConfigError,
    FabricError,
    NoZygote,
    ParkFailed,
    ProtocolError,
    WorkerDied,
    ZygoteProtocolError,
)
from ..tasks import Background, within
from ..worker import control, wake
from ..worker.messages import FROM_WORKER, Exit, Failed, Hello, Parked, WorkerMessage, decode
from . import criu, cuda, parking, rundir
from .contain import Containment
from .memory import Pressure
from .preloads import Preloads
from .templates import Template, TemplateMap, Templates

if TYPE_CHECKING:
    from ..envs import Env

log = logging.getLogger(__name__)
T = TypeVar("T")

Key = tuple[str, frozenset[str]]  # (environment's site-packages or "", import family)
BASE: Key = ("", frozenset())

START_TIMEOUT = 300.0  # a zygote importing torch on a loaded 2-core host takes minutes
HELLO_TIMEOUT = 30.0


class ZygoteHandle:
    def __init__(self, pool: Pool, ctrl: socket.socket, pid: int, modules: frozenset[str],
                 site: str = "", preloaded: frozenset[str] = frozenset()) -> None:
        self.pool = pool
        self.ctrl = ctrl
        self.pid = pid
        self.modules = modules
        self.preloaded = preloaded  # what it imported (or tried to) besides its family
        self.site = site  # the environment it entered; "": the server's own
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.failed: dict[str, str] = {}
        self.last_used = time.monotonic()
        self._pending: dict[int, asyncio.Future] = {}  # req -> (answer, descriptors)
        self._reqs = itertools.count()
        # workers asked of it that the pool does not know yet: its answer may be read before
        # the fork's caller resumes and registers the worker, and it must live until then
        self.forking = 0
        ctrl.setblocking(False)
        asyncio.get_running_loop().add_reader(ctrl.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            received = control.receive(self.ctrl, control.TO_SERVER)
        except (BlockingIOError, InterruptedError):
            return
        except ZygoteProtocolError as exc:  # a zygote that sends nonsense is as good as dead
            log.error("zygote %d sent what is not a control message (%s); killing it",
                      self.pid, exc)
            self._fail(ZygoteProtocolError(f"zygote {self.pid}: {exc.message}", pid=self.pid,
                                           **exc.fields))
            self._kill()  # dropped like any dead one once its socket closes
            return
        except OSError as exc:
            received = None
            log.warning("zygote %d control socket failed: %s", self.pid, exc)
        if received is None:
            self._lost()
            return
        message, fds = received
        if isinstance(message, control.Ready):
            self.failed = message.failed
            if not self.ready.done():
                self.ready.set_result(message)
        elif isinstance(message, control.Exited):
            self.pool.child_exited(message.pid, message.status)
        elif isinstance(message, control.ANSWERS) and message.req is not None \
                and (future := self._pending.pop(message.req, None)) is not None \
                and not future.done():
            future.set_result((message, fds))
        else:  # a request whose waiter gave up, or a refusal of a message without a req
            log.warning("zygote %d: %s answers no waiting request", self.pid, message)
            for fd in fds:
                os.close(fd)

    def _lost(self) -> None:
        asyncio.get_running_loop().remove_reader(self.ctrl.fileno())
        self.ctrl.close()
        self._fail(FabricError(f"zygote {self.pid} exited", pid=self.pid))
        self.pool.orphaned(self)
        self.pool.zygote_lost(self)

    def _fail(self, error: FabricError) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        if not self.ready.done():
            self.ready.set_exception(error)

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    async def request(self, message: control.ForkWorker | control.ForkZygote,
                      ) -> tuple[control.Forked | control.ZygoteForked, list[int]]:
        """The zygote's answer to `message` and the descriptors it carries; a refusal, or an
        answer of another kind, is a ZygoteProtocolError."""
        if self.ctrl.fileno() < 0:
            raise NoZygote(f"zygote {self.pid} is gone", pid=self.pid)
        req = next(self._reqs)
        future = asyncio.get_running_loop().create_future()
        self._pending[req] = future
        control.send(self.ctrl, dataclasses.replace(message, req=req))
        self.last_used = time.monotonic()
        answer, fds = await self._within(future)
        if isinstance(answer, control.ZygoteRefused):
            raise ZygoteProtocolError(f"zygote {self.pid} refused {message.op}: {answer.error}",
                                      pid=self.pid, op=message.op)
        if not isinstance(answer, message.answer):
            for fd in fds:
                os.close(fd)
            raise ZygoteProtocolError(f"zygote {self.pid} answered {message.op} with {answer.op}",
                                      pid=self.pid, op=message.op)
        return answer, fds

    async def until_ready(self) -> None:
        await self._within(asyncio.shield(self.ready))  # others may wait for it too

    async def _within(self, answer: Awaitable) -> Any:
        """`answer`'s result; a zygote that does not answer in START_TIMEOUT is as good as
        dead: it is killed, so that it is dropped (and rebuilt) like any dead one."""
        try:
            return await within(answer, START_TIMEOUT)
        except TimeoutError:
            self._kill()
            raise

    def busy(self) -> bool:
        """Whether a request to it awaits its answer, or a worker it forked is not yet known
        to the pool."""
        return self.forking > 0 or any(not future.done() for future in self._pending.values())

    def stop(self) -> None:
        if self.ctrl.fileno() >= 0:
            asyncio.get_running_loop().remove_reader(self.ctrl.fileno())
            self.ctrl.close()  # the zygote exits on EOF; its children die with it
            self._fail(NoZygote(f"zygote {self.pid} was stopped", pid=self.pid))
            self.pool.orphaned(self)  # no exit of theirs is reported any more


class WorkerHandle:
    """One worker process, as seen by the server: its socket, its pid, its death.

    A worker forked by a zygote is that zygote's child, which reports its exit. A restored
    worker (from a template or a cool image) is a child of this process, its exit watched
    through a pidfd; when it runs under an init, in a PID namespace of its own, `pid` is the
    init's, which forwards signals and exits with the worker's status. Every process of it
    (its init, the processes its cells start) lives in its cage (`contain`), killed with it.
    Pids here are as this host sees them, whatever the worker's own namespace calls them.
    """

    def __init__(self, pool: Pool, ident: int, zygote: ZygoteHandle | None,
                 path: Path | None = None, source: str = "zygote", user: str = "") -> None:
        self.pool = pool
        self.id = ident
        self.user = user  # whose cells it runs ("": the server's own user)
        self.cage = pool.containment.cage(ident, user)
        self.zygote = zygote
        self.source = source
        self.init = False  # `pid` is an llfabric-init's, under which the worker runs
        # `pid` is pid 1 of the worker's namespace (a template's copy): a dump takes the
        # namespace whole; otherwise it takes the worker's own tree (see `criu`)
        self.namespace = False
        self.pid = 0
        self.process = 0  # the worker's own pid (the init's child, when it has an init)
        self.parked = False  # its CUDA state is checkpointed off the GPU
        self.moved: Parked | None = None  # what it moved off the GPU itself, while parked
        self.device: str | None = None  # the GPU its CUDA state is on, or was parked from
        self.debugged = False  # it runs a debugger (`debugging`), whose connections CRIU refuses
        self.path = path or pool.socket_dir / f"w{ident}.sock"
        self.socket = pool.context.socket(zmq.PAIR)
        self.socket.linger = 0
        self.socket.bind(f"ipc://{self.path}")
        self.died: asyncio.Future = asyncio.get_running_loop().create_future()
        # a worker that dies leaves none of its processes behind
        self.died.add_done_callback(lambda _: self.cage.kill())
        self.exit_status: int | None = None
        self.failure = ""  # the last line of what ended it, if it said (`Failed`)
        self.generation = 0  # its environment's, when it was made (`Env.generation`)

    @property
    def endpoint(self) -> str:
        return f"ipc://{self.path}"

    def tree(self) -> list[int]:
        """The worker's pid, then those of the processes its cells started and left running."""
        try:
            children = psutil.Process(self.process).children(recursive=True)
        except psutil.Error:
            children = []
        return [self.process, *(child.pid for child in children)]

    async def send(self, message: WorkerMessage) -> None:
        """Send to the worker; WorkerDied if it exits first (a PAIR socket whose peer is gone
        would hold the message forever)."""
        await self._unless_dead(self.socket.send(protocol.pack(message.to_wire())), None)

    async def recv(self, timeout: float | None = None) -> WorkerMessage:
        """The worker's next message; WorkerDied if it exits first, or sends one this wire does
        not have (it is killed: a worker out of step with the server cannot be trusted)."""
        while True:
            frame = await self._unless_dead(self.socket.recv(), timeout)
            try:
                message = decode(protocol.unpack(frame, max_size=1 << 31), FROM_WORKER)
            except ProtocolError as exc:
                self.kill()
                raise WorkerDied(f"worker {self.pid} sent a malformed message ({exc.message})",
                                 pid=self.pid) from exc
            if not isinstance(message, Failed):
                return message
            # its last words: it exits next, and its death says why
            told = message.traceback.rstrip()
            log.error("worker %d failed:\n%s", self.pid, told)
            self.failure = told.rpartition("\n")[2][:200]

    async def _unless_dead(self, awaited: Awaitable[T], timeout: float | None) -> T:
        """`awaited`'s result (a socket's send or recv), or WorkerDied if the worker exits or
        `timeout` passes first; it is cancelled unless it ended."""
        operation = asyncio.ensure_future(awaited)  # the socket's own future, as it is
        try:
            done, _ = await asyncio.wait({operation, self.died}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            operation.cancel()  # no-op once it is done
        if operation in done:
            return operation.result()
        if self.died.done():
            raise WorkerDied(self.death_reason(), pid=self.pid)
        raise WorkerDied(f"worker {self.pid} did not answer in {timeout} s", pid=self.pid)

    def watch(self, pid: int, init: bool) -> None:
        """Report the exit of `pid`, our own child (an init if `init`), to the pool."""
        self.pid, self.init = pid, init
        self.pool.workers[pid] = self
        pidfd = os.pidfd_open(pid)
        loop = asyncio.get_running_loop()

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                self.pool.child_exited(pid, None)
                return
            code = os.waitstatus_to_exitcode(status)
            if init and code > 128:  # the init's way of saying "killed by signal code - 128"
                status = code - 128
            self.pool.child_exited(pid, status)

        loop.add_reader(pidfd, exited)

    def death_reason(self) -> str:
        status = self.exit_status
        killed = status is None or (os.WIFSIGNALED(status)
                                    and os.WTERMSIG(status) == signal.SIGKILL)
        if killed and self.cage.out_of_memory():  # the kernel's OOM killer, any kind
            limit = self.pool.containment.worker_memory
            why = (f"its processes passed the worker_memory limit ({limit} bytes)" if limit
                   else "the host's memory ran out")
            return (f"the worker process (pid {self.pid}) ran out of memory: {why}, and the "
                    f"kernel killed it")
        if status is None:
            return f"worker {self.pid} died"
        if os.WIFSIGNALED(status):
            name = signal.Signals(os.WTERMSIG(status)).name
            return f"the worker process (pid {self.pid}) was killed by {name}"
        failure = f" after {self.failure}" if self.failure else ""
        return (f"the worker process (pid {self.pid}) exited with status "
                f"{os.WEXITSTATUS(status)}{failure}")

    def interrupt(self) -> None:
        if self.pid and not self.died.done():
            os.kill(self.pid, signal.SIGINT)

    def kill(self) -> None:
        """Kill the worker now, and every process of its cage (an init, and with it the
        worker in its namespace; the processes its cells started)."""
        if self.pid and not self.died.done():
            self.cage.kill()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    async def close(self) -> None:
        """Retire the worker: ask it to exit, kill it if it does not; then whatever its cells
        left running."""
        if self.pid and not self.died.done():
            # through the plain socket: the asyncio one queues even a NOBLOCK send behind a
            # send still in its queue (one just cancelled), where no peer may ever take it
            with contextlib.suppress(zmq.ZMQError):  # zmq.Again: no worker connected to ask
                zmq.Socket.shadow(self.socket.underlying).send(protocol.pack(Exit().to_wire()),
                                                               flags=zmq.NOBLOCK)
            try:
                await within(asyncio.shield(self.died), 5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
        await asyncio.to_thread(self.cage.remove)  # waits, off the loop, for the killed to go
        self.socket.close()
        self.path.unlink(missing_ok=True)
        self.pool.workers.pop(self.pid, None)
        if self.zygote in self.pool.retired:  # perhaps its last worker
            self.pool.stop_retired()


class Pool:
    def __init__(self, store_root: Path, max_zygotes: int = 4,
                 worker_source: str = "zygote", keep_warm: float = 0.0, cool_after: float = 0.0,
                 zygote_memory: int = 0, pressure: Pressure | None = None, gpu: bool = False,
                 worker_memory: int = 0, user_pids: int = 0,
                 environ: dict[str, str] | None = None, save_limit: float = 0.0,
                 track_writes: bool = True) -> None:
        self.store_root = store_root
        self.containment = Containment(worker_memory, user_pids)
        # what zygotes and workers start with (`environ`); None: the server's own
        self.environ = dict(os.environ) if environ is None else environ
        self.save_limit = save_limit  # seconds a worker may pickle one group; 0: no limit
        self.track_writes = track_writes  # whether workers' saves track writes (`snapshot.delta`)
        self.max_zygotes = max_zygotes
        # bytes that family zygotes may hold (their unique memory); 0: a quarter of the host's
        self.zygote_memory = zygote_memory or psutil.virtual_memory().total // 4
        self.worker_source = choose_source(worker_source, gpu)
        # seconds a session's worker stays warm after its cell; 0: retired after each cell
        self.keep_warm = keep_warm
        # seconds a pinned worker idles before it is dumped to disk; 0: never
        self.cool_after = cool_after if cool_after > 0 and not criu.unavailable() else 0.0
        # whether memory is short, when warm workers retire and pinned ones cool (`lifecycle`)
        self.pressure = pressure or Pressure.here(90)
        self.context = zmq.asyncio.Context()
        self.socket_dir, self._held = rundir.make()  # a dead server's folder goes first
        # A worker running as its session's user reconnects here after a cool restore: it
        # passes through (0711) to the socket given to it (`_give`), never into the images.
        for images in ("templates", "cool"):
            (self.socket_dir / images).mkdir(mode=0o700)
        os.chmod(self.socket_dir, 0o711)
        self.templates = Templates(self.socket_dir / "templates", self.socket_dir, store_root)
        self.cuda: cuda.Driver | None = None  # the CUDA checkpoint driver, on GPU hosts
        self.zygotes: dict[Key, ZygoteHandle] = {}
        self.retired: set[ZygoteHandle] = set()  # of a changed environment, kept for its workers
        self.generations: dict[str, int] = {}  # site -> generation its zygotes were built at
        self.preloads = Preloads()  # what each family's workers imported on first use
        self.workers: dict[int, WorkerHandle] = {}
        self._ids = itertools.count(1)
        self._base_proc: subprocess.Popen | None = None
        # what runs beside its callers: builds, rebuilds, the base zygote's restart, and each
        # worker's making and loading (`lifecycle.Life`); `stop` ends them
        self.tasks = Background("pool")
        self._building: dict[Key, asyncio.Task] = {}
        self._reviving: asyncio.Task | None = None  # the restart of a dead base zygote

    async def start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._base_proc = subprocess.Popen(
            [sys.executable, "-m", "fabric.worker.zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=self.environ,
            # a signal to the server's process group (Ctrl-C, a service's stop) is the server's
            # to act on: it stops its zygotes in order, and one that died first would be
            # restarted meanwhile; it dies with the server all the same (PDEATHSIG)
            start_new_session=True,
        )
        theirs.close()
        base = ZygoteHandle(self, mine, self._base_proc.pid, frozenset())
        self.zygotes[BASE] = base
        await base.until_ready()

    async def _revive_base(self) -> None:
        """Reap the dead base zygote and start another, backing off while starts fail."""
        delay = 0.0
        while True:
            if self._base_proc is not None:
                await asyncio.to_thread(self._base_proc.wait)  # no zombie left behind
            await asyncio.sleep(delay)
            try:
                await self.start()
                log.info("base zygote restarted as %d", self.zygotes[BASE].pid)
                return
            except (FabricError, OSError, TimeoutError) as exc:
                if (base := self.zygotes.pop(BASE, None)) is not None:
                    base.stop()
                if self._base_proc is not None:
                    self._base_proc.kill()
                delay = min(max(delay * 2, 1.0), 60.0)
                log.warning("the base zygote did not start (%s); retrying in %.0f s", exc, delay)

    async def zygote_for(self, needs: frozenset[str], family: frozenset[str] | None = None,
                         site: str = "") -> ZygoteHandle:
        """The smallest ready zygote of the environment `site` that has imported `needs`;
        failing one, build `family` (a superset of `needs`, such as everything the session
        imports) from its nearest ancestor, so that the session's later cells find it ready."""
        for key in sorted(self.zygotes, key=lambda k: len(k[1])):
            if key[0] == site and key[1] >= needs and self.zygotes[key].ready.done():
                zygote = self.zygotes[key]
                zygote.last_used = time.monotonic()
                return zygote
        key = (site, needs if family is None else family | needs)
        if key not in self._building:
            self._building[key] = self.tasks.start(self._build(key))
        return await asyncio.shield(self._building[key])

    async def _build(self, key: Key) -> ZygoteHandle:
        """The zygote of `key`, forked from the nearest ancestor in its environment, or from
        the base zygote, entering the environment, when it has none yet; with the family's
        preloads. Where `key` has a zygote (the preloads grew), it serves until this one is
        ready, and then retires; this one is not its child, which would outlive it as an
        orphan, outside the server's process tree."""
        site, modules = key
        started = self.generations.get(site)
        current = self.zygotes.get(key)
        preloads = self.preloads.of(key)
        try:
            parent = max((z for (s, f), z in self.zygotes.items() if s == site and f <= modules
                          and z is not current and z.ready.done() and z.ready.exception() is None),
                         key=lambda z: len(z.modules), default=None)
            enter = ""
            if parent is None and site and (base := self.zygotes.get(BASE)) is not None \
                    and base.ready.done() and base.ready.exception() is None:
                parent, enter = base, site
            if parent is None:
                raise NoZygote(f"no zygote is ready to build {sorted(modules)} from")
            missing = sorted(modules - parent.modules) + sorted(preloads - parent.preloaded)
            reply, fds = await parent.request(control.ForkZygote(modules=missing, site=enter))
            zygote = ZygoteHandle(self, socket.socket(fileno=fds[0]), reply.pid, modules, site,
                                  parent.preloaded | preloads)
            if current is None:
                self.zygotes[key] = zygote
            try:
                await zygote.until_ready()
            except BaseException as exc:
                zygote.stop()
                if self.zygotes.get(key) is zygote:
                    del self.zygotes[key]
                if not isinstance(exc, asyncio.CancelledError):  # a preload may be why
                    self.preloads.refuse(key, preloads - parent.preloaded)
                raise
            self.preloads.refuse(key, preloads.intersection(zygote.failed))
            if self.generations.get(site) != started:  # an install while it imported
                if self.zygotes.get(key) is zygote:
                    del self.zygotes[key]
                self.retired.add(zygote)
                raise NoZygote(f"environment {site} changed while a zygote was built")
            if (old := self.zygotes.get(key)) is not None and old is not zygote:
                self.retired.add(old)  # the zygote it replaces: kept while its workers live
            self.zygotes[key] = zygote
            self._evict()
            return zygote
        finally:
            if self._building.get(key) is asyncio.current_task():
                del self._building[key]

    def learn_first_use(self, worker: WorkerHandle, modules: list[str]) -> None:
        """Remember what `worker`'s cell imported on first use for its zygote's family, and
        build that family's zygote again, holding it, off any cell's path. Not for the base
        zygote: it is started, not forked, and every environment's zygotes descend from it."""
        zygote = worker.zygote
        if zygote is None or (key := (zygote.site, zygote.modules)) == BASE \
                or not self.preloads.learn(key, modules):
            return
        held = self.zygotes.get(key)
        if held is not None and held.ready.done() and key not in self._building \
                and not self.preloads.of(key) <= held.preloaded:
            log.info("zygote family %s is rebuilt to preload %s", sorted(key[1]),
                     sorted(self.preloads.of(key) - held.preloaded))
            self._building[key] = self.tasks.start(self._build(key), "a zygote's preloads")

    def refresh(self, env: Env) -> int:
        """`env`'s generation now; if it changed since its zygotes and templates were built
        (a package was installed), they retire, so that new workers see what it holds now,
        and the same families are built again in the background, off any cell's path."""
        site, generation = str(env.site), env.generation()
        if self.generations.setdefault(site, generation) != generation:
            self.generations[site] = generation
            families = [k[1] for k in self.zygotes if k[0] == site]
            for family in families:
                self.retired.add(self.zygotes.pop((site, family)))
            for key in [k for k in self._building if k[0] == site]:
                del self._building[key]  # they end stale; the rebuilds below start afresh
            images = self.templates.retire(site)
            self._evict()
            log.info("environment %s changed: its zygotes and templates are rebuilt", env.name)
            for family in families:
                self.tasks.start(self.zygote_for(family, None, site), "a zygote rebuild")
            for family in images:
                self.templates.build_soon(family, site)
        return generation

    def _busy(self) -> set[int]:
        """The zygotes that live workers were forked from (they die with it), and those
        forking one now."""
        forking = {z.pid for z in (*self.zygotes.values(), *self.retired) if z.busy()}
        return forking | {w.zygote.pid for w in self.workers.values() if w.zygote is not None}

    def stop_retired(self) -> None:
        """Stop the retired zygotes that no live worker was forked from."""
        busy = self._busy()
        for zygote in [z for z in self.retired if z.pid not in busy]:
            self.retired.discard(zygote)
            zygote.stop()

    def _evict(self) -> None:
        """Drop least recently used families while there are more than `max_zygotes` or they
        hold more than `zygote_memory`; never the newest, nor one with live workers (they die
        with it)."""
        self.stop_retired()
        busy = self._busy()
        families = sorted((k for k in self.zygotes if k != BASE),
                          key=lambda k: self.zygotes[k].last_used)
        memory = {f: _unique_memory(self.zygotes[f].pid) for f in families}
        count, total = len(families), sum(memory.values())
        for family in families[:-1]:
            if count <= self.max_zygotes and total <= self.zygote_memory:
                return
            if self.zygotes[family].pid not in busy:
                self.zygotes.pop(family).stop()
                count, total = count - 1, total - memory[family]

    async def new_worker(self, needs: frozenset[str], family: frozenset[str] | None = None,
                         env: Env | None = None, user: str = "") -> WorkerHandle:
        """A fresh worker of `user` ("": the server's own) with `needs` imported from
        environment `env` (None: the server's own), from the cheapest source ready now.

        With templates, a restore of a template covering `needs` once one is built (until then,
        and should a restore fail, a zygote fork); otherwise a zygote fork. What is built for
        later is `family`, a superset of `needs` such as all the session imports.
        """
        modules = needs if family is None else family | needs
        site = str(env.site) if env is not None else ""
        generation = self.refresh(env) if env is not None else 0
        worker = None
        if self.worker_source == "template":
            template = self.templates.ready(needs, site)
            if template is None:
                self.templates.build_soon(modules, site)
            else:
                try:
                    worker = await self.restore_worker(template, user)
                except (FabricError, OSError) as exc:  # CheckpointError, WorkerDied, ...
                    log.warning("template restore failed, forking instead: %s", exc)
        if worker is None:
            try:
                worker = await self.fork_worker(needs, family, site, user)
            except (FabricError, OSError, TimeoutError) as exc:
                log.warning("no zygote could fork a worker (%s); starting a cold one", exc)
                worker = await self.cold_worker(site, user)
        worker.generation = generation
        return worker

    async def fork_worker(self, needs: frozenset[str], family: frozenset[str] | None = None,
                          site: str = "", user: str = "") -> WorkerHandle:
        zygote = await self.zygote_for(needs, family, site)
        worker = WorkerHandle(self, next(self._ids), zygote, user=user)
        try:
            zygote.forking += 1
            try:
                reply, _ = await zygote.request(control.ForkWorker(endpoint=worker.endpoint,
                                                                   store=str(self.store_root)))
                worker.pid = worker.process = reply.pid
                self.workers[worker.pid] = worker
            finally:
                zygote.forking -= 1
            worker.cage.enter(reply.pid)  # before its hello: it has run nothing of a session
            await self._hello(worker)
        except BaseException:
            await worker.close()
            raise
        return worker

    async def cold_worker(self, site: str = "", user: str = "") -> WorkerHandle:
        """A worker started as a fresh process, without a zygote: the last resort."""
        worker = WorkerHandle(self, next(self._ids), None, source="cold", user=user)
        try:
            pid = os.posix_spawn(
                sys.executable, [sys.executable, "-m", "fabric.worker.cold", worker.endpoint,
                                 str(self.store_root), *([site] if site else [])], self.environ,
                setsid=True,
                file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
            worker.process = pid
            worker.cage.enter(pid)
            worker.watch(pid, init=False)
            await self._hello(worker)
        except BaseException:
            await worker.close()
            raise
        return worker

    async def restore_worker(self, template: Template, user: str = "") -> WorkerHandle:
        """Restore a copy of `template`, wake it, and wait until it has connected."""
        root = await self.templates.restore(template)
        return await self.wake_restored(root, None, "template", parked=False, device=None,
                                        user=user)

    async def wake_restored(self, root: int, process: int | None, source: str, parked: bool,
                            device: str | None, user: str = "") -> WorkerHandle:
        """Wake the worker of `user` restored under the init `root`, as `process` (None: the
        init's only child, and `root` pid 1 of its namespace, a template's copy), and await
        its hello; its tree (with what its cells left running, for a cool one) enters its cage.

        `parked`: it was dumped with its CUDA state checkpointed (off `device`), which stays
        so until its first cell's lease (`unpark`) puts it on the leased GPU."""
        try:
            pid = criu.worker_of(root) if process is None else process
            path = wake.restored_socket(self.socket_dir, wake.name_of(pid))
        except BaseException as exc:
            os.kill(root, signal.SIGKILL)
            os.waitpid(root, 0)
            if isinstance(exc, OSError):
                raise WorkerDied(f"the restored worker under {root} is gone: {exc}") from exc
            raise
        worker = WorkerHandle(self, next(self._ids), None, path=path, source=source, user=user)
        worker.process, worker.namespace = pid, process is None
        worker.parked, worker.device = parked, device
        try:
            worker.cage.enter_tree(root)
            _give(worker.path, pid)
            worker.watch(root, init=True)
            os.kill(pid, wake.WAKE)
            await self._hello(worker)
        except BaseException:
            await worker.close()
            raise
        return worker

    async def _hello(self, worker: WorkerHandle) -> None:
        hello = await worker.recv(timeout=HELLO_TIMEOUT)
        if not isinstance(hello, Hello):
            raise WorkerDied(f"worker {worker.pid} sent {hello.op!r} before hello")

    async def park(self, worker: WorkerHandle, device: str | None) -> None:
        """Checkpoint the worker's CUDA state off `device`, the GPU its cell ran on (nothing
        to do on CPU hosts), once it moved its own storages off."""
        if self.cuda is not None and not worker.parked:
            if self.cuda.holds(worker.process):
                worker.moved = await parking.move_off(worker)
                if worker.moved.fallback:
                    log.info("worker %d: the driver parks all of it: %s", worker.pid,
                             worker.moved.fallback)
            worker.parked = await asyncio.to_thread(parking.suspend_tree, self.cuda,
                                                    worker.tree())
            worker.device = device if worker.parked else worker.device

    async def unpark(self, worker: WorkerHandle, device: str | None) -> None:
        """Put a parked worker's CUDA state back on its cell's lease's GPUs (`device`,
        comma-joined), moving it there, GPU by GPU in order, if it was parked from others."""
        if self.cuda is not None and worker.parked:
            moves = _moves(worker.device, device)
            await asyncio.to_thread(parking.resume_tree, self.cuda, worker.tree(), moves)
            await parking.move_back(worker)  # a worker cooled and thawed still holds its own
            worker.parked, worker.device, worker.moved = False, device or worker.device, None

    def memory_pressure(self) -> bool:
        return self.pressure.check()

    def memory(self, worker: WorkerHandle) -> int:
        """The worker's share of host memory: the proportional bytes (PSS) of its processes
        (with its init, if it has one), so that pages it shares with its zygote, or with other
        workers, count once across them all."""
        try:
            process = psutil.Process(worker.pid)
            tree = (process, *process.children(recursive=True))
        except psutil.Error:
            return 0
        return sum(_proportional_memory(p) for p in tree)

    def memory_by_user(self) -> dict[str, int]:
        """The memory (`memory`) each user's workers hold, by `WorkerHandle.user`."""
        held: dict[str, int] = {}
        for worker in list(self.workers.values()):
            if not worker.died.done():
                held[worker.user] = held.get(worker.user, 0) + self.memory(worker)
        return held

    def child_exited(self, pid: int, status: int | None) -> None:
        worker = self.workers.get(pid)
        if worker is not None and not worker.died.done():
            worker.exit_status = status
            worker.died.set_result(status)

    def orphaned(self, zygote: ZygoteHandle) -> None:
        """`zygote` is gone or stopped: its workers die with it (PDEATHSIG), unreported."""
        for worker in list(self.workers.values()):
            if worker.zygote is zygote and not worker.died.done():
                worker.died.set_result(None)

    def zygote_lost(self, zygote: ZygoteHandle) -> None:
        for key, handle in list(self.zygotes.items()):
            if handle is zygote:
                del self.zygotes[key]
        self.retired.discard(zygote)
        base = self._base_proc is not None and zygote.pid == self._base_proc.pid
        if base and not zygote.modules and (self._reviving is None or self._reviving.done()):
            log.warning("the base zygote %d died; restarting it", zygote.pid)
            self._reviving = self.tasks.start(self._revive_base(),
                                               "restarting the base zygote")

    async def stop(self) -> None:
        await self.tasks.close()
        for worker in list(self.workers.values()):
            if worker.pid and not worker.died.done():
                with contextlib.suppress(ProcessLookupError):  # reaped, not yet told
                    os.kill(worker.pid, signal.SIGKILL)
            worker.socket.close()
        self.containment.stop()  # and whatever their cells left running
        for zygote in (*self.zygotes.values(), *self.retired):
            zygote.stop()
        await self.templates.stop()
        if self._base_proc is not None:
            try:
                self._base_proc.wait(5)
            except subprocess.TimeoutExpired:
                self._base_proc.kill()
        self.context.destroy(linger=0)  # any socket left open: term alone would wait on it
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        os.close(self._held)

    def status(self) -> PoolMap:
        return {
            "zygotes": [{"pid": z.pid, "modules": sorted(f), "env": site, "ready": z.ready.done(),
                         "memory": _unique_memory(z.pid), "preloaded": sorted(z.preloaded)}
                        for (site, f), z in self.zygotes.items()],
            "workers": [{"pid": w.pid, "source": w.source,
                         "zygote": w.zygote.pid if w.zygote is not None else None,
                         "parked": w.parked, "moved": w.moved.moved if w.moved else 0,
                         "fallback": w.moved.fallback if w.moved else None}
                        for w in self.workers.values()],
            "worker_source": self.worker_source,
            "templates": self.templates.status(),
        }


class ZygoteMap(TypedDict):
    pid: int
    modules: list[str]
    env: str  # the site-packages of the environment it entered; "": the server's
    ready: bool
    memory: int  # bytes only it holds
    preloaded: list[str]  # what it imported besides its family: its workers' first uses


class WorkerMap(TypedDict):
    pid: int
    source: str
    zygote: int | None
    parked: bool  # its CUDA state is off the GPU
    moved: int  # bytes the worker moved into host memory itself, while parked
    fallback: str | None  # why it moved none


class PoolMap(TypedDict):
    """The pool's processes, as `status` reports them."""

    zygotes: list[ZygoteMap]
    workers: list[WorkerMap]
    worker_source: str
    templates: list[TemplateMap]


def choose_source(configured: str, gpu: bool) -> str:
    """Where fresh workers come from: `configured` (zygote, template, or auto: zygotes), and
    zygotes wherever templates cannot work: without CRIU, and on GPU hosts, where CUDA cannot
    initialize in a template copy (its PID namespace sees the host's /proc; the driver answers
    error 304)."""
    if configured not in ("zygote", "template", "auto"):
        raise ConfigError(f"worker_source must be zygote, template or auto, not {configured!r}")
    if configured != "template":
        return "zygote"
    why = ("CUDA cannot initialize in a template copy's PID namespace" if gpu
           else criu.unavailable())
    if why:
        log.warning("workers fork from zygotes: templates cannot work here (%s)", why)
        return "zygote"
    return "template"


def _moves(parked: str | None, leased: str | None) -> dict[str, str] | None:
    """The device map that puts a worker parked off `parked`'s GPUs onto `leased`'s (both
    CUDA_VISIBLE_DEVICES values), pairing them in order; None if it stays where it was."""
    if not parked or not leased or parked == leased:
        return None
    old, new = parked.split(","), leased.split(",")
    if len(old) != len(new):  # its CUDA state spans a number of GPUs the lease does not give
        raise ParkFailed(f"the worker was parked off {len(old)} GPUs and its cell leased "
                         f"{len(new)}")
    return {a: b for a, b in zip(old, new, strict=True) if a != b}


def _give(path: Path, pid: int) -> None:
    """Let the restored worker `pid` connect to its socket at `path`, which only its user can:
    one that runs as its session's user could not connect to one of the server's."""
    try:
        uid = psutil.Process(pid).uids().real
    except psutil.Error as exc:
        raise WorkerDied(f"restored worker {pid} is gone: {exc}", pid=pid) from exc
    if uid != os.geteuid():
        os.chown(path, uid, -1)


def _proportional_memory(process: psutil.Process) -> int:
    """`process`'s PSS; its resident bytes where its smaps cannot be read (another user's
    process, to a server without the right to trace it); 0 once it is gone."""
    try:
        try:
            return process.memory_full_info().pss
        except psutil.AccessDenied:
            return process.memory_info().rss
    except psutil.Error:
        return 0


def _unique_memory(pid: int) -> int:
    """Bytes only this process holds (USS): what evicting it frees; pages shared with the
    zygote it was forked from are not counted."""
    try:
        return psutil.Process(pid).memory_full_info().uss
    except psutil.Error:
        return 0

"""The worker runtime: the code a forked worker runs, talking to the server over one PAIR socket.

Messages from the server: ``become`` (on a host serving several users, a fresh worker's
first: run as the session's user from now on), ``load`` (groups, imports and ambient state to
put in the namespace), ``run`` (a cell; with ``replay``, a cell run again to rebuild what could
not be saved: nothing is saved after it), ``settle`` (after a replay: make the namespace the
head's, see `settle`), ``debug`` (serve a debugger, see `debugging`), ``sleep`` (close the
socket and wait to be dumped; see `wake`), ``exit``.
The worker answers ``hello`` once connected, ``loaded`` after a become or a load, ``output``
frames while a cell runs, ``started`` when user code starts, ``saving`` when it has ended and
``done`` after it has saved the state the cell may have changed; ``debugging`` (its debug
port) after a debug; ``sleeping`` before it sleeps
and ``hello`` again once woken on its new endpoint. What llfabric itself has to say (a long
save's progress) goes in ``notice`` frames (``topic``, ``text``), never in the cell's outputs.
A cell's input() or getpass() sends ``input`` and waits for the server's ``input_reply``
(``value``, or ``error``). Blobs go straight to the store (on a host serving several users, the
session's user's part of it: the worker runs as that user before it loads anything); the server
alone signs and commits manifests, and a worker never reads the store's key.
"""

from __future__ import annotations

import builtins
import contextlib
import getpass
import importlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

import zmq
from IPython.core.error import StdinNotImplementedError
from IPython.core.interactiveshell import ExecutionResult

from .. import protocol
from ..closure.groups import group_variables
from ..closure.plan import plan
from ..errors import CellStopped, FabricError, LoadFailed, ProtocolError
from ..snapshot import ambient, catalog, codec, written
from ..snapshot.commit import Report
from ..snapshot.delta import DeltaSaver, Saved
from ..snapshot.store import Store
from . import comms, deadline, debugging, env, forked, introspect, lazy, parking, threads, wake
from .account import become
from .fdcapture import FdCapture
from .imports import FirstUse
from .interrupts import Interrupts
from .messages import (
    TO_WORKER,
    Answered,
    AskInput,
    Become,
    CellOutput,
    CommIn,
    CompleteCode,
    DebugCells,
    DebugPort,
    Done,
    Exit,
    Failed,
    Flushing,
    Hello,
    InputReply,
    InspectName,
    Load,
    Loaded,
    Park,
    Parked,
    Refused,
    Rehome,
    RunCell,
    Saving,
    Settle,
    Settled,
    Sleep,
    Sleeping,
    Started,
    Unpark,
    WorkerMessage,
    WorkerNotice,
    decode,
)
from .shell import OutStream, ZMQInteractiveShell

LAST_WORDS_WAIT = 2.0  # seconds a failing worker waits for its socket to say why
DESCRIBE_LIMIT = 0.5  # seconds describing one value for the catalog may take (its repr)


class _Channel:
    """The worker's socket, shared by the cell's thread and the stream flusher."""

    def __init__(self, endpoint: str) -> None:
        self._lock = threading.Lock()
        self._connect(endpoint)

    def _connect(self, endpoint: str) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.PAIR)
        self.socket.linger = 2000
        self.socket.connect(endpoint)
        self.endpoint = endpoint

    def send(self, message: WorkerMessage) -> None:
        if forked.in_child():  # the wire is the worker's: a copy would garble it, or hang on
            return  # a lock another thread held at the fork
        with self._lock:
            self.socket.send(protocol.pack(message.to_wire()))

    def recv(self) -> WorkerMessage:
        """The server's next message; ProtocolError if it is not one this wire has."""
        return decode(protocol.unpack(self.socket.recv()), TO_WORKER)

    def close(self) -> None:
        self.socket.close()
        self.context.term()  # waits (linger) until what was sent has left

    def last_words(self) -> None:
        """Tell the server what is ending this worker (the exception being handled), unless
        another thread holds the socket past a moment: it may be what went wrong."""
        if self._lock.acquire(timeout=LAST_WORDS_WAIT):
            try:
                self.socket.send(protocol.pack(Failed(traceback.format_exc()).to_wire()))
            finally:
                self._lock.release()

    def sleep(self, wake_dir: str | None = None) -> None:
        """Close the socket, sleep through a dump, connect on waking in `wake_dir` (else the
        directory of the socket it had).

        Other threads' sends wait on the lock meanwhile and go to the new socket.
        """
        with self._lock:
            self.close()
            self._connect(wake.sleep(Path(wake_dir) if wake_dir else
                                     Path(self.endpoint[len("ipc://"):]).parent))


class Worker:
    def __init__(self, shell: ZMQInteractiveShell, channel: _Channel, store: Store) -> None:
        self.shell = shell
        self.channel = channel
        self.store = store
        # The session names this namespace speaks for: what it loaded, and what any cell run on
        # it has bound. One of them missing after a cell was deleted by it, even on a worker kept
        # for many cells; names it never had stay as the session committed them.
        self.owned: set[str] = set()
        self.saver = DeltaSaver(store)
        self.undescribed: set[str] = set()  # names a save changed whose description it missed
        self.described_imports: dict[str, str] = {}  # alias -> module, as last described here
        self.lazy = lazy.Lazy(shell, lambda blobs: self.store.get_objects(blobs), self._loaded)
        self.restored_ambient = False
        self.slept_in = ""  # its directory when it last slept through a dump
        self.first_use = FirstUse()
        # names whose group could not be unpickled -> (why, traceback): never bound here; a
        # cell that reads them fails as the load would have, one that only deletes them runs
        self.unloadable: dict[str, tuple[str, str]] = {}
        self.became = False  # runs as its session's user (`become`)
        self.ambient: dict[str, Any] = {}  # the ambient state restored, carried where unread
        # the blob of the ambient state restored or last saved, and its parts pickled
        self.ambient_saved: tuple[str, dict[str, bytes]] | None = None
        self.base_environ = dict(os.environ)
        self.threads = threads.Threads()
        self.storages = parking.Storages()  # what a park moved off the GPU
        self.interrupts = Interrupts()
        self._streams = [OutStream("stdout", shell), OutStream("stderr", shell)]
        shell.sink = self._sink
        sys.stdout, sys.stderr = self._streams
        self._captures = [FdCapture(1, self._streams[0]), FdCapture(2, self._streams[1])]
        builtins.input = self._input
        getpass.getpass = self._getpass
        introspect.collect_payloads(shell)
        comms.install(channel.send, shell)
        forked.watch(self._streams, shell)

    def _ask(self, prompt: str, password: bool) -> str:
        """Ask the user, through the server and the client, as a kernel asks its frontend."""
        for stream in self._streams:
            stream.flush()
        self.channel.send(AskInput(str(prompt), password))
        reply = self.channel.recv()
        if not isinstance(reply, InputReply):
            raise ProtocolError(f"the server answered input() with {reply.op!r}")
        if reply.error is not None:
            raise StdinNotImplementedError(reply.error)
        return reply.value or ""

    def _input(self, prompt: object = "") -> str:
        return self._ask(str(prompt), password=False)

    def _getpass(self, prompt: str = "Password: ", stream: object = None) -> str:
        return self._ask(prompt, password=True)

    def _sink(self, kind: str, **fields: Any) -> None:
        # nbformat's output types, plus clear_output and update_display_data as frontends know
        # them
        self.channel.send(CellOutput({"output_type": kind, **fields}))

    def _flush_forever(self) -> None:
        while True:
            time.sleep(OutStream.interval * 2)
            for stream in self._streams:
                stream.send()

    def serve(self) -> None:
        threading.Thread(target=self._flush_forever, daemon=True).start()
        self.channel.send(Hello(os.getpid()))
        handlers = {Become: self.become, Rehome: self.rehome, Load: self.load, RunCell: self.run,
                    Settle: self.settle, Park: self.park, Unpark: self.unpark,
                    Sleep: self.sleep, CompleteCode: self.complete,
                    InspectName: self.inspect, CommIn: self.comm, DebugCells: self.debug}
        while True:
            try:
                message = self.channel.recv()
            except ProtocolError as exc:  # answered, so that the server hears of it
                self.channel.send(Refused(exc.message))
                continue
            if isinstance(message, Exit):
                return
            handler = handlers.get(type(message))
            self.channel.send(handler(message) if handler is not None
                              else Refused(f"a worker takes no {message.op!r} here"))

    def sleep(self, message: Sleep) -> Hello:
        written.reset()  # a restored copy's pages say nothing of what its saves hashed
        self.channel.send(Sleeping(os.getpid()))
        cwd = os.getcwd()
        os.chdir("/")  # the image names no directory that the host restoring it may lack
        self.channel.sleep(message.wake_dir)
        with contextlib.suppress(OSError):  # not there: a move says where cells run (`rehome`)
            os.chdir(cwd)
        self.slept_in = cwd
        return Hello(os.getpid())

    def park(self, message: Park) -> Parked:
        try:
            return self.storages.park()
        except Exception as exc:  # the server retires a worker it could not park
            return Parked(error=f"{type(exc).__name__}: {exc}")

    def unpark(self, message: Unpark) -> Parked:
        try:
            return Parked(seconds=self.storages.resume())
        except Exception as exc:
            return Parked(error=f"{type(exc).__name__}: {exc}")

    def debug(self, message: DebugCells) -> DebugPort:
        try:
            if not message.trace:
                debugging.stop()
                return DebugPort()
            port = debugging.start(self.shell)
        except Exception as exc:  # the server tells the frontend why it cannot debug
            return DebugPort(error=f"{type(exc).__name__}: {exc}")
        self.base_environ.update(debugging.ENVIRON)  # llfabric's, never saved as the session's
        return DebugPort(port)

    def complete(self, message: CompleteCode) -> Answered:
        return Answered(self._answer(introspect.complete, message.code, message.cursor))

    def inspect(self, message: InspectName) -> Answered:
        return Answered(self._answer(introspect.inspect, message.code, message.cursor,
                                     message.detail))

    def comm(self, message: CommIn) -> Answered:
        self.shell.handling(message.parent_id)
        return Answered(comms.receive(message))

    def _answer(self, ask: Any, *args: Any) -> dict:
        """The reply's content; what the user's objects raise is the reply's error, never
        the worker's end."""
        try:
            return ask(self.shell, *args)
        except Exception as exc:
            return {"status": "error", "ename": type(exc).__name__, "evalue": str(exc),
                    "traceback": []}

    def load(self, message: Load) -> Loaded:
        start = time.monotonic()
        _use_devices(message.device)
        self.saver.track = message.track_writes  # before its buffers are given to the tracker
        ns = self.shell.user_ns
        try:
            if message.cwd is not None and not self.restored_ambient:
                os.chdir(message.cwd)
                sys.path.insert(0, message.cwd)
            if not self.restored_ambient:  # first: its cwd and sys.path find the modules below
                ambient.reseed()  # then the session's state, where it has one, overrides it
                if message.ambient:
                    self.ambient = self._read_ambient(message.ambient)
                    for problem in ambient.restore(self.ambient):
                        self._notice("ambient", problem)
                    env.front()  # the session's saved sys.path may predate its environment
                self.restored_ambient = True
            for alias, module in message.imports.items():
                try:
                    ns[alias] = importlib.import_module(module)
                except ImportError as exc:  # made importable by what this worker lacks
                    self._notice("ambient", f"{alias} is not bound: {module} cannot be imported "
                                 f"again here ({type(exc).__name__}: {exc})")
                    continue
                self.owned.add(alias)
            objects = self.store.get_objects([blob for blob, _ in message.groups],
                                             self._progress("loading"))
            for (blob, names), encoded in zip(message.groups, objects, strict=True):
                self.saver.seed(blob, encoded)  # before the values exist: none can write them
                try:
                    values = codec.loads(encoded, ns)
                except Exception as exc:  # a class gone, a __setstate__ that fails: see `run`
                    why = (f"{type(exc).__name__}: {exc}", traceback.format_exc())
                    self.unloadable.update(dict.fromkeys(names, why))
                    continue
                for name in names:
                    ns[name] = values[name]
                self._loaded(names, blob, encoded.nbytes)
            self.lazy.add(message.lazy)
        except Exception as exc:  # reported to the user as the cell's error, never hidden
            return Loaded(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return Loaded(seconds=time.monotonic() - start)

    def _loaded(self, names: list[str] | tuple[str, ...], blob: str, nbytes: int) -> None:
        """The namespace holds the group `blob` (bound as `names`) of the session's version."""
        self.owned.update(names)
        self.saver.loaded(names, blob, nbytes)

    def become(self, message: Become) -> Loaded | Refused:
        """Run as the session's user from now on, writing only into their part of the store;
        once, before anything of the session is loaded."""
        if self.restored_ambient or self.became:
            return Refused("a worker becomes its session's user once, before its first load")
        account = message.account
        try:
            become(account)
        except Exception as exc:  # the server closes a worker that could not
            return Loaded(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        self.became = True
        self.base_environ.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
        self.store = Store(Path(account.store), signs=False)
        self.saver = DeltaSaver(self.store)
        return Loaded()

    def rehome(self, message: Rehome) -> Loaded:
        """Use the store of the host that restored this worker (it is where the server looks
        for what the next cell saves), and run cells in the session's directory there."""
        self.store = Store(Path(message.store), signs=False)
        self.saver = DeltaSaver(self.store)
        if message.cwd is None:
            return Loaded()
        try:
            os.chdir(message.cwd)
        except OSError as exc:
            return Loaded(error=f"the notebook's directory {message.cwd} is not on this host "
                                f"({exc.strerror}): its cells run in {os.getcwd()}")
        # where its modules were imported from, as the first load put it on sys.path
        sys.path[:] = [message.cwd if p == self.slept_in else p for p in sys.path]
        return Loaded()

    def run(self, message: RunCell) -> Done:
        _use_devices(message.device)
        if message.threads > 0:  # the leased cores
            self.threads.grant(message.threads)
            # llfabric's setting, not the session's: never saved as a change it made
            self.base_environ.update(threads.environ(self.threads.count))
        self.shell.execution_count = message.execution_count
        ns = self.shell.user_ns
        unloadable = {n: why for n, why in self.unloadable.items() if n not in ns}
        analysis = plan(message.source).analysis
        bounded = analysis.parsed and not analysis.dynamic
        deleting = analysis.only_deleted if bounded else frozenset()
        if needed := sorted((analysis.reads if bounded else set(unloadable)) & set(unloadable)
                            - deleting):
            why, trace = unloadable[needed[0]]
            return Done(status="error", ename=LoadFailed.__name__, failed=LoadFailed(
                f"could not load the session's state: {why}", traceback=trace).to_wire())
        stand_ins = {n: object() for n in deleting & set(unloadable)}  # for `del` to remove
        ns.update(stand_ins)
        self.owned.update(stand_ins)  # gone after the cell: deleted from the session
        # IPython runs no cell without streams: one that set `sys.stdout = None` is followed by
        # cells with the worker's again, as on a fresh worker
        sys.stdout = self._streams[0] if sys.stdout is None else sys.stdout
        sys.stderr = self._streams[1] if sys.stderr is None else sys.stderr
        self.shell.handling(message.parent_id)
        introspect.take_payloads(self.shell)  # none of an earlier cell's
        started = time.monotonic()
        outcome = None
        try:  # armed before `started`: the server may interrupt once it hears it
            outcome = self.interrupts.during(lambda: self._run_started(message.source))
        finally:
            error = _error_of(outcome)
            forked.leave_if_child(outcome is None or error is not None)
            for stream in self._streams:
                stream.flush()
            lazy_seconds, unneeded = self.lazy.end()
            for name, stand_in in stand_ins.items():
                if ns.get(name) is stand_in:  # not deleted after all: still as committed
                    del ns[name]
                    self.owned.discard(name)
            self.unloadable = {n: why for n, why in self.unloadable.items()
                               if n not in ns and (n not in stand_ins or n not in self.owned)}
        if isinstance(outcome, KeyboardInterrupt):  # taken in IPython's steps around the code
            self.shell.showtraceback((KeyboardInterrupt, outcome, None))
        ran = time.monotonic()
        # An interrupt now stops the save (user code runs in it: a value's `__reduce__`, its
        # `__repr__`): what is not written yet stays unsaved, held by this worker.
        saved = failed = None
        try:
            saving = self.interrupts.during(lambda: self._save_ran(message))
        except FabricError as exc:  # a full disk: the cell ran, nothing of it is committed
            failed = exc.to_wire()
        else:
            if isinstance(saving, KeyboardInterrupt):  # before its groups were written, or after
                failed = CellStopped("the cell's save was interrupted: nothing the cell changed "
                                     "is committed", reason="save").to_wire()
            else:
                saved = saving
        for stream in self._streams:
            stream.flush()
        return Done(status="error" if error is not None else "ok",
                    ename=type(error).__name__ if error is not None else None,
                    run=ran - started, save=time.monotonic() - ran,
                    saved=saved, failed=failed, payload=introspect.take_payloads(self.shell),
                    lazy=lazy_seconds, unneeded=unneeded,
                    first_use=self.first_use.since(analysis.imports))

    def _run_started(self, source: str) -> ExecutionResult:
        self.channel.send(Started())
        return self.shell.run_cell(source, store_history=True)

    def _save_ran(self, message: RunCell) -> Report | None:
        self.channel.send(Saving())
        self.saver.track = message.track_writes
        return None if message.replay else self.save(message.reached, message.save_limit)

    def settle(self, message: Settle) -> Settled:
        """After a replay, make every saved name the head's: a group whose value here pickles to
        the head's object is kept (with what the replay made from it), any other is loaded from
        the head, and a name the head does not have is deleted, but for `keep` (what the replay
        was for). A value of `keep` sharing objects with a value that pickled otherwise than the
        head's is not trusted (the replay may not have reproduced it): it is deleted too.
        `want`: names that must be here afterwards."""
        ns = self.shell.user_ns
        present = set(self.shell.user_variables())
        want, keep = set(message.want), set(message.keep)
        differ, loaded, kept, reload = set(), [], [], []
        try:
            self.saver.objects.clear()  # what it loaded before the replay was another version
            for blob, names in message.groups:
                here = [n for n in names if n in present]
                if not here and not want.intersection(names):
                    continue
                if len(here) == len(names):
                    encoded = codec.dumps({n: ns[n] for n in names}, ns)
                    if self.store.fingerprint(encoded)[0] == blob:
                        self.saver.loaded(names, blob, encoded.nbytes)
                        kept.extend(names)
                        continue
                differ.update(here)
                loaded.extend(names)
                reload.append((blob, names))
            # Equal values may pickle apart (pickle memoizes by identity): only a value of `keep`
            # linked to a differing one is in doubt.
            linked = [set(g) for g in group_variables(ns, sorted((keep | differ) & present)).groups
                      if keep.intersection(g) and differ.intersection(g)]
            doubt = set().union(*linked)
            objects = self.store.get_objects([blob for blob, _ in reload])
            for (blob, names), encoded in zip(reload, objects, strict=True):
                values = codec.loads(encoded, ns)
                for name in names:
                    ns[name] = values[name]
                self.saver.loaded(names, blob, encoded.nbytes)
            imports = message.imports
            for alias, module in imports.items():
                if alias in present | want and getattr(ns.get(alias), "__name__", None) != module:
                    ns[alias] = importlib.import_module(module)
            named = {n for _, names in message.groups for n in names} | set(imports)
            for name in present - named - (keep - doubt):
                del ns[name]
            self.owned.update(self.shell.user_variables())
            if message.ambient:  # the head's RNG states, whatever the replay drew
                self.ambient = self._read_ambient(message.ambient)
                ambient.restore(self.ambient)
        except Exception as exc:
            return Settled(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return Settled(diverged=sorted(doubt - keep), loaded=sorted(loaded), kept=sorted(kept),
                       dropped=sorted(doubt & keep),
                       missing=sorted(keep - present - set(ambient.notebook_hooks())))

    def _notice(self, topic: str, text: str) -> None:
        """Tell the server what llfabric did, apart from the cell's outputs."""
        self.channel.send(WorkerNotice(topic, text))

    def _progress(self, doing: str) -> Any:
        def report(done: int, total: int) -> None:
            self._notice("progress", f"{doing} {done / 1e6:.0f} of {total / 1e6:.0f} MB")
        return report

    def save(self, reached: list[str] | None, limit: float = 0.0) -> Report:
        """Write the groups the cell may have changed (see `snapshot.delta`), each pickled
        within `limit` seconds (0: no limit)."""
        ns = self.shell.user_ns
        names = self.shell.user_variables()
        imports = {n: ns[n].__name__ for n in names if issubclass(type(ns[n]), types.ModuleType)}
        state = [n for n in names if n not in imports]
        hooks = ambient.notebook_hooks()  # held like a value that cannot be saved
        held = dict.fromkeys(hooks, "an import hook lives only in its process")
        described = catalog.EMPTY

        def captured(saved: Saved) -> None:
            """Describe what changed, the cell's last user code; then only writes remain,
            and the server may give the execution slot back."""
            nonlocal described
            described = self._describe(ns, [*saved.changed, *saved.unsaved, *held], imports)
            self.channel.send(Flushing())

        saved = self.saver.save(ns, state, reached, self._progress("saving"),
                                lambda: deadline.limit(limit), captured)
        self.owned.update(names)
        return Report(groups=saved.groups, kept=saved.kept, imports=imports, refs=saved.refs,
                     packages=saved.packages,
                     ambient=self._save_ambient(),
                     owned=sorted(self.owned), unsaved=saved.unsaved | held, bounded=saved.bounded,
                     hooks=hooks, described=described, devices=saved.devices)

    def _describe(self, ns: dict[str, Any], changed: list[str],
                  imports: dict[str, str]) -> catalog.Catalog:
        """The catalog entries of `changed`, of the modules imported under a name not described
        here yet, and of those left undescribed by a save the user stopped (described at the
        next one); a group whose object is the one loaded or saved before keeps the entry it
        had then."""
        modules = {alias for alias, module in imports.items()
                   if self.described_imports.get(alias) != module}
        names = sorted({*changed, *modules} | self.undescribed)
        try:
            described = catalog.describe(ns, names, lambda: deadline.limit(DESCRIBE_LIMIT))
        except KeyboardInterrupt:  # the user stopped the save
            self.undescribed = set(names)
            return catalog.EMPTY
        self.undescribed, self.described_imports = set(), imports
        return described

    def _read_ambient(self, blob: str) -> dict[str, Any]:
        """The ambient state stored as `blob`; the next save compares with it."""
        state = pickle.loads(self.store.get(blob))
        self.ambient_saved = (blob, _pickled_parts(state))
        return state

    def _save_ambient(self) -> str:
        """The blob of the ambient state now: the one restored or last saved where no part of
        it changed (equal states may pickle apart as a whole: pickle memoizes by identity), so
        that a cell that changed nothing leaves the session's version as it was; written again
        where this host's disk lacks it (read from a peer's copy, or saved on another host
        before the worker moved)."""
        self.ambient = ambient.capture(self.ambient, self.base_environ)
        parts = _pickled_parts(self.ambient)
        saved = self.ambient_saved
        if saved is None or saved[1] != parts or not self.store.has(saved[0]):
            saved = self.ambient_saved = (self.store.put(pickle.dumps(self.ambient)), parts)
        return saved[0]


def _error_of(outcome: ExecutionResult | KeyboardInterrupt | None) -> BaseException | None:
    """What ended a cell's code: its error, or an interrupt IPython did not catch."""
    if isinstance(outcome, ExecutionResult):
        return outcome.error_in_exec or outcome.error_before_exec
    return outcome


def _pickled_parts(state: dict[str, Any]) -> dict[str, bytes]:
    return {key: pickle.dumps(part) for key, part in state.items()}


def main(shell: ZMQInteractiveShell, endpoint: str, store_root: str) -> None:
    """Entry point in the freshly forked child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake.block()  # before any thread starts, so that every thread inherits it blocked
    channel = _Channel(endpoint)
    try:
        Worker(shell, channel, Store(Path(store_root), signs=False)).serve()
    except BaseException:
        channel.last_words()
        raise
    finally:
        channel.close()


def _use_devices(device: str | None) -> None:
    """The leased GPUs, if any: CUDA reads them when it first initializes."""
    if device:
        os.environ["CUDA_VISIBLE_DEVICES"] = device

"""Zygotes: pre-imported processes that fork workers and child zygotes.

A zygote holds an IPython shell with no user state and whatever modules its import family needs;
forking it gives a worker that starts a cell in milliseconds instead of paying an interpreter
start and the imports. The base zygote is started by the server; every other zygote is forked
from its nearest ancestor and imports only what is missing.

The server drives a zygote over its control socket (see `control` for the messages): fork a
worker, fork a child zygote (whose control socket goes back with the answer); the zygote reports
`Ready` once after its imports and `Exited` for each child that ends. A message it cannot read
gets a `ZygoteRefused` answer, and the zygote goes on serving. A zygote exits when its control
socket closes (the server evicted it or went away); a worker dies with its zygote
(PR_SET_PDEATHSIG). Zygotes do not die with their parent zygote: evicting an ancestor must not
take the families forked from it.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from ..errors import ZygoteProtocolError
from ..snapshot import ambient
from . import control, env, runner, threads
from .shell import make_shell


def exit_after(live: Callable[[], object]) -> NoReturn:
    """Run a forked or started child's whole life, then leave at once: no interpreter teardown,
    no atexit handler of the parent's or the shell's; a failure's traceback on the real stderr."""
    code = 0
    try:
        live()
    except BaseException:
        traceback.print_exc(file=sys.__stderr__)
        code = 1
    finally:
        os._exit(code)


def die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Zygote:
    def __init__(self, ctrl: socket.socket) -> None:
        self.ctrl = ctrl
        self.shell = make_shell()

    def import_modules(self, modules: list[str]) -> None:
        imported, failed = [], {}
        for name in modules:
            try:
                with self.shell.builtin_trap:  # modules see get_ipython(), as in a cell
                    importlib.import_module(name)
                imported.append(name)
            except BaseException as exc:  # a module may even sys.exit(); the zygote must live
                failed[name] = f"{type(exc).__name__}: {exc}"
        ambient.warm()
        threads.warm()
        self.shell.transform_cell("x[0]\n")  # compiles tokenize's pattern: no worker pays for it
        # What is imported now lives as long as the zygote: out of the collector's sight, a
        # child's collections never write to the pages that hold it, so they stay shared (a
        # torch worker's private memory falls from about 53 MB to 11 MB).
        gc.collect()
        gc.freeze()
        control.send(self.ctrl, control.Ready(pid=os.getpid(), imported=imported, failed=failed))

    def serve(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

        sel = selectors.DefaultSelector()
        sel.register(self.ctrl, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                if key.fileobj == wake_r:
                    os.read(wake_r, 512)
                    self._reap()
                    continue
                try:
                    received = control.receive(self.ctrl, control.TO_ZYGOTE)
                except ZygoteProtocolError as exc:  # the server's mistake: answered, not dropped
                    req = exc.fields.get("req")
                    control.send(self.ctrl, control.ZygoteRefused(
                        req=req if isinstance(req, int) else None, error=exc.message))
                    continue
                if received is None:
                    os._exit(0)  # the server went away
                message, _ = received
                if isinstance(message, control.ForkWorker):
                    self._fork_worker(message)
                else:
                    self._fork_zygote(message)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            try:
                control.send(self.ctrl, control.Exited(pid=pid, status=status))
            except (BrokenPipeError, ConnectionResetError):
                os._exit(0)  # the server went away, as an end of file on its socket says

    def _child_hygiene(self, keep: int | None = None) -> None:
        """A child keeps stdio and `keep`; every other inherited descriptor is closed."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if keep is None:
            os.closerange(3, 1 << 16)
        else:
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 16)

    def _fork_worker(self, message: control.ForkWorker) -> None:
        pid = os.fork()
        if pid == 0:
            def live() -> None:
                die_with_parent()
                os.setsid()  # its own session, so that CRIU can dump it (no "shell job")
                self._child_hygiene()
                runner.main(self.shell, message.endpoint, message.store)

            exit_after(live)
        control.send(self.ctrl, control.Forked(req=message.req, pid=pid))

    def _fork_zygote(self, message: control.ForkZygote) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            def live() -> None:
                self._child_hygiene(keep=theirs.fileno())
                self.ctrl = theirs
                if message.site:
                    env.enter(message.site)
                self.import_modules(message.modules)
                self.serve()

            exit_after(live)
        theirs.close()
        control.send(self.ctrl, control.ZygoteForked(req=message.req, pid=pid), [mine.fileno()])
        mine.close()


def detach_from_cwd() -> None:
    """Run from `/`, without the starting directory on sys.path: a session sets its own."""
    start = os.getcwd()
    os.chdir("/")
    sys.path[:] = [p for p in sys.path if p not in ("", start)]


def main() -> None:
    ctrl = socket.socket(fileno=int(sys.argv[1]))
    die_with_parent()
    detach_from_cwd()
    zygote = Zygote(ctrl)
    zygote.import_modules(sys.argv[2:])
    zygote.serve()


if __name__ == "__main__":
    main()

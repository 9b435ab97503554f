"""A dormant worker: a zygote's state (shell, imported family) with no sockets, waiting to wake.

This is the process that a template's images hold. It is started by the server under
`llfabric-init --pidns` (so it is pid 2 of its own PID namespace), imports its family, reports
`ready` on its control socket, closes it and blocks in `sigwait` for `WAKE`. The server then
dumps the namespace with CRIU, once, and restores it as often as it needs workers. A restored
copy is woken by `WAKE` (sent to its init, which forwards it) and connects to the endpoint
named after its pid as the server sees it (see `wake`); from there on it is a worker like any
forked one.

    python -m fabric.worker.dormant CTRL_FD SOCKET_DIR STORE LOG SITE [MODULE...]

SITE is the site-packages of the environment it enters first, or "" for the server's own.

Until it sleeps, its stdout and stderr go to LOG; then to /dev/null, since CRIU refuses to
restore a regular file that has changed size since the dump.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from . import env, runner, wake
from .zygote import Zygote, detach_from_cwd, exit_after


def _redirect_output(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main() -> None:
    ctrl = socket.socket(fileno=int(sys.argv[1]))
    socket_dir, store, log = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    wake.block()  # first: the dump may catch it anywhere after `ready`, and the wake must wait
    _redirect_output(log)
    detach_from_cwd()
    zygote = Zygote(ctrl)
    if sys.argv[5]:
        env.enter(sys.argv[5])
    zygote.import_modules(sys.argv[6:])
    _redirect_output(os.devnull)
    ctrl.close()  # the server dumps once it sees this close: nothing outside may stay open
    endpoint = wake.sleep(socket_dir)
    exit_after(lambda: runner.main(zygote.shell, endpoint, store))  # as a forked worker


if __name__ == "__main__":
    main()

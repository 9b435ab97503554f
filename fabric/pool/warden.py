"""The warden of a server's cgroups: `python -m fabric.pool.warden CGROUP...`.

Started by the server (`contain.Containment`) in a session of its own, it waits for the end of
its stdin, a pipe whose other end only the server holds: the server stopped, or was killed
outright. Then it kills whatever its workers left in those cgroups and removes them, so that
no process a cell started outlives its server.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from .contain import sweep


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the server
    while sys.stdin.buffer.read(4096):
        pass
    for root in sys.argv[1:]:
        sweep(Path(root))


if __name__ == "__main__":
    main()

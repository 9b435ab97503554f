"""The cells running on a host, each with the clients that follow it (`fabric.following`).

A running cell whose clients are no longer connected (gone, killed, or silent) runs on for
`detached_grace` seconds, its outputs kept, so that another client (the kernel started after
one that died) can `follow` it; with nobody following it by then, it is stopped, so that its
lease comes back. A cell whose user's key was revoked is stopped within a heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..config import Config
from ..errors import SessionBusy
from ..following import Run, Send
from ..protocol import Wire
from ..session import Session

log = logging.getLogger(__name__)


class Runs:
    def __init__(self, config: Config, send: Send) -> None:
        """`send`: a frame to a client's connection."""
        self.config = config
        self.send = send
        # the executes in progress, by their sessions' names (one cell at a time each), and
        # those that ended while no client followed them, their final frames not yet taken
        self.running: dict[str, Run] = {}
        self.unclaimed: dict[str, Run] = {}

    def start(self, session: Session, connection: bytes, msg_id: str) -> Run | None:
        """The `Run` of an execute of a session not running a cell (another one is refused as
        busy, its frames its own client's only)."""
        if session.name in self.running or session.lock.locked():
            return None
        run = self.running[session.name] = Run(session, self.send,
                                               output_limit=self.config.output_limit)
        run.attach(connection, msg_id, follow=False)
        self.unclaimed.pop(session.name, None)  # a new cell: the one before is no one's
        return run

    def end(self, run: Run, final: Wire, still_open: bool) -> None:
        """The run's final frame (no msg_id), to whoever follows it, else kept while its
        session is open."""
        name = run.session.name
        if self.running.get(name) is run:
            del self.running[name]
        if not run.finish(final) and still_open:
            log.warning("session %s: its cell ended while no client followed it; its outputs "
                        "are kept for the next client that follows it", name)
            self.unclaimed[name] = run

    def follow(self, stored: str, connection: bytes, msg_id: str) -> bool:
        """Send `connection` the session's running cell, or one that ended unfollowed; False
        if there is none."""
        run = self.running.get(stored) or self.unclaimed.pop(stored, None)
        if run is None:
            return False
        run.attach(connection, msg_id)
        return True

    def check_close(self, stored: str, name: str, connection: bytes) -> None:
        """Only a client that follows the session's running cell may close it (which stops
        the cell): another sharing the session, refused a cell of its own, must not."""
        run = self.running.get(stored)
        if run is not None and connection not in run.targets:
            raise SessionBusy(f"session {name} is running another client's cell; it stays "
                              f"open (`llfabric stop {name}` stops that cell)", session=name)

    def stopping(self, stored: str) -> None:
        """The session's cell is being stopped on request."""
        if (run := self.running.get(stored)) is not None:
            run.stopping = True

    def forget(self, stored: str) -> None:
        """The session closed: the reply of a cell that ended unfollowed goes with it."""
        self.unclaimed.pop(stored, None)

    def detached(self, stored: str) -> float | None:
        """Seconds since the clients of the session's running cell went away, while none
        follows it."""
        run = self.running.get(stored)
        if run is None or run.detached is None or run.targets:
            return None
        return time.monotonic() - run.detached

    async def watch(self, connected: Callable[[bytes], bool]) -> None:
        """Notice the running cells whose clients are no longer `connected`: each runs on for
        `detached_grace` seconds unless a client follows it, then is stopped."""
        grace = self.config.detached_grace
        while True:
            await asyncio.sleep(self.config.heartbeat or 1)
            now = time.monotonic()
            for run in list(self.running.values()):
                session = run.session
                if not run.stopping and not run.admitted():
                    log.warning("session %s: its user's key was revoked; stopping its cell",
                                session.name)
                    run.stopping = True
                    session.stop("revoked")
                elif run.prune(connected):
                    run.detached = now
                    if grace <= 0:
                        log.warning("session %s: its client went away; stopping its cell",
                                    session.name)
                        run.stopping = True
                        session.stop("client")
                    else:
                        log.warning("session %s: its client went away; its cell runs on for "
                                    "%d s unless a client follows it", session.name, grace)
                        run.no_stdin()
                elif (run.detached is not None and not run.targets and not run.stopping
                      and now - run.detached >= grace):
                    log.warning("session %s: no client followed its cell within %d s; "
                                "stopping it", session.name, grace)
                    run.stopping = True
                    session.stop("detached")

"""A cell running on a worker: its messages relayed to the client, its input() asked of the
client, its interrupt escalated to a kill when the cell swallows it.

An interrupt is a KeyboardInterrupt in the cell; if the cell's code still runs `grace` seconds
later, its worker is killed so that its lease comes back. Once the worker says it is saving,
the interrupt stops the save instead (user code runs in it: a value's `__reduce__` or
`__repr__`), leaving what is not written yet in the worker; a save still going `grace` seconds
later is killed likewise, and the cell commits nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import CellStopped, FabricError, NotWaiting, WorkerDied
from ..worker.messages import (
    AskInput,
    CellOutput,
    CommOut,
    Done,
    Flushing,
    InputReply,
    Saving,
    Started,
    WorkerNotice,
)

if TYPE_CHECKING:
    from .cells import EventSink
    from .pool import WorkerHandle

STOPS = {  # why the server stopped a running cell, as the user is told
    "interrupt": "the cell did not stop within {grace:g} s of its interrupt",
    "save": "the cell's save did not stop within {grace:g} s of its interrupt",
    "close": "the session was closed while the cell ran",
    "client": "the client that ran the cell stopped answering",
    "detached": "the client that ran the cell went away and no other followed it in time",
    "stop": "`llfabric stop` stopped it",
    "revoked": "the key of the user who ran it was revoked",
    "moved": "the cluster's front door lost this host while the cell ran (cut off or paused), "
             "and the session moves to another host",
}


class Running:
    def __init__(self, session: str, worker: WorkerHandle, events: EventSink, stdin: bool,
                 grace: float) -> None:
        self.session, self.worker, self.events = session, worker, events
        self.stdin = stdin  # the client answers input requests
        self.grace = grace
        self.began = False  # the cell's code has started
        self.started: float | None = None  # when its code began, on this process's clock
        self.saving = False  # the cell's code has ended; its worker saves
        self.stopped: str | None = None  # why its worker was killed
        # called once its state is captured and only written now (`Flushing`)
        self.flushing: Callable[[], None] | None = None
        self._answer: asyncio.Future | None = None  # the client's answer to its input()
        self._escalation: asyncio.TimerHandle | None = None  # the kill an interrupt schedules

    async def relay(self) -> Done:
        """Relay the cell's messages to the client until it is done."""
        while True:
            message = await self.worker.recv()
            if isinstance(message, CellOutput):
                self.events(message.output)
            elif isinstance(message, CommOut):
                self.events(message.event(), "comm")
            elif isinstance(message, WorkerNotice):
                self.events.notice(message.topic, message.text)
            elif isinstance(message, Started):
                self.started, self.began = time.monotonic(), True
            elif isinstance(message, Saving):  # an interrupt before this stopped the code
                self.saving = True
                self.end()
            elif isinstance(message, Flushing):
                if self.flushing is not None:
                    self.flushing()
            elif isinstance(message, AskInput):
                answer = await self._ask(message)
                if answer is not None:  # None: interrupted; the worker stopped waiting
                    await self.worker.send(answer)
            elif isinstance(message, Done):
                return message
            else:
                self.worker.kill()
                raise WorkerDied(f"worker {self.worker.pid} sent {message.op!r} during a cell")

    async def _ask(self, request: AskInput) -> InputReply | None:
        """The client's answer to the cell's input(), or None if the cell was interrupted or
        its worker died first."""
        if not self.stdin:
            return InputReply(error="input() was called, but the client that runs this cell "
                              "does not answer input requests")
        self._answer = asyncio.get_running_loop().create_future()
        self.events({"prompt": request.prompt, "password": request.password}, "input_request")
        try:
            await asyncio.wait({self._answer, self.worker.died},
                               return_when=asyncio.FIRST_COMPLETED)
            answer = self._answer.result() if self._answer.done() else None
        finally:
            self._answer = None
        return None if answer is None else InputReply(**answer)

    def answer(self, value: str | None, error: str | None) -> dict[str, bool]:
        """The client's answer to the cell's input request."""
        if self._answer is None or self._answer.done():
            raise NotWaiting(f"no cell of session {self.session} is waiting for input",
                              session=self.session)
        self._answer.set_result({"error": error} if error is not None else {"value": value or ""})
        return {"answered": True}

    def interrupt(self) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(None)
        self.worker.interrupt()
        if self._escalation is None:
            self._escalation = asyncio.get_running_loop().call_later(self.grace, self._escalate)

    def _escalate(self) -> None:
        self._escalation = None
        self.stop("save" if self.saving else "interrupt")

    def stop(self, reason: str) -> None:
        """Kill the worker now (`reason`, a key of STOPS)."""
        if not self.worker.died.done():
            self.stopped = reason
            self.worker.kill()

    def end(self) -> None:
        """The cell's code is over (an interrupt's kill now waits for another interrupt, of
        its save), or the cell is (committed, or failed): no interrupt escalates any more."""
        if self._escalation is not None:
            self._escalation.cancel()
            self._escalation = None

    def failed(self, exc: WorkerDied, version: int) -> FabricError:
        """What the client is told when the worker died during the cell: stopped by the server
        (`stopped`), or died on its own; either way the session stays at `version`."""
        if self.stopped is not None:
            why = STOPS[self.stopped].format(grace=self.grace)
            return CellStopped(f"{why}: its worker was killed and the session stays at version "
                               f"{version}", session=self.session, version=version,
                               reason=self.stopped)
        return WorkerDied(f"{exc.message}; the session stays at version {version}",
                          session=self.session, version=version, started=self.began)

"""What a session's live worker is asked between cells, without a lease: completions,
inspections, and a frontend's comm messages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..errors import WorkerDied
from ..protocol import Wire
from ..worker.messages import (
    Answered,
    CellOutput,
    CommIn,
    CommOut,
    CompleteCode,
    InspectName,
    WorkerNotice,
)
from .cells import EventSink, Head
from .lifecycle import Keeper, Life
from .pool import WorkerHandle

log = logging.getLogger(__name__)

ASK_WAIT = 2.0  # seconds a question waits for a worker's answer before the catalog answers it
ASK_LIMIT = 30.0  # a worker silent this long on a question is out of step: it is retired


class Questions:
    """Puts questions to one session's live worker: the one `live` gives for a head, if any."""

    def __init__(self, name: str, keeper: Keeper, live: Callable[[Head], Life | None]) -> None:
        self.name, self.keeper, self.live = name, keeper, live

    async def complete(self, source: str, cursor: int, head: Head) -> Wire | None:
        """The live worker's `complete_reply` content (see `_ask`)."""
        return await self._ask(CompleteCode(source, cursor), head)

    async def inspect(self, source: str, cursor: int, detail: int, head: Head) -> Wire | None:
        """The live worker's `inspect_reply` content (see `_ask`)."""
        return await self._ask(InspectName(source, cursor, detail), head)

    async def _ask(self, question: CompleteCode | InspectName, head: Head) -> Wire | None:
        """The answer of the session's live worker to a completion or an inspection, without a
        lease; None when no worker can answer now: none is live, it runs a cell, it is being
        readied, woken or asked already, its CUDA state is parked (its CUDA calls would block),
        or it takes longer than ASK_WAIT (it answers on meanwhile, before anything else is sent
        to it)."""
        life = self.live(head)
        if life is None or not life.task.done():
            return None
        return await self._put(life, question, ASK_WAIT)

    async def comm(self, msg_type: str, content: dict, buffers: list[bytes], head: Head,
                   events: EventSink, parent_id: str | None = None) -> bool:
        """Hand a frontend's comm message to the live worker, which holds the comm, after what
        was sent to it before, without a lease; its callbacks' outputs and comm messages go to
        `events`. False when no worker can take it (none is live, or parked, or it runs a
        cell) or its comm refused it."""
        life = self.live(head)
        message = CommIn(msg_type, content, buffers, parent_id)
        answer = None if life is None else await self._put(life, message, ASK_LIMIT, events)
        return answer is not None and answer.get("status") == "ok"

    async def _put(self, life: Life, message: CompleteCode | InspectName | CommIn, wait: float,
                   events: EventSink | None = None) -> dict | None:
        """`message` to `life`'s worker once what was sent before is done; its answer's
        content, or None if it has none within `wait` seconds or is parked. What it says
        meanwhile (outputs, comm messages, notices) goes to `events`, if any."""
        answer: asyncio.Future = asyncio.get_running_loop().create_future()

        async def step(worker: WorkerHandle) -> None:
            if worker.parked:
                answer.set_result(None)
                return
            await worker.send(message)
            while not isinstance(reply := await worker.recv(timeout=ASK_LIMIT), Answered):
                if isinstance(reply, CellOutput):
                    if events is not None:
                        events(reply.output)
                elif isinstance(reply, CommOut):
                    if events is not None:
                        events(reply.event(), "comm")
                elif isinstance(reply, WorkerNotice):
                    log.info("session %s: %s", self.name, reply.text)
                else:
                    raise WorkerDied(f"worker {worker.pid} answered {message.op!r} with "
                                     f"{reply.op!r}")
            answer.set_result(reply.content)

        life.chain(step, prepares=False)
        self.keeper.changed()
        await asyncio.wait({answer, life.task}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        return answer.result() if answer.done() else None

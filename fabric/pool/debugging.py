"""A session's debugger as the server serves it: the Jupyter debug protocol (a debug adapter
protocol request in each `debug_request`, its events as `debug_event`s) against the debugpy of
the worker that runs the session's cell.

A frontend's debug session outlives any worker: it starts (initialize, attach), sets
breakpoints, and then cells run on whichever worker the host readies for them. So the session
keeps what the frontend set up (its breakpoints and exception filters) and answers it between
cells itself. Each cell run while the frontend debugs connects to its worker's debug adapter
(`worker.debugging`) before the cell starts, sets that up again, and disconnects when the cell
ends: a worker kept, parked, cooled or retired after its cell holds no debug session, and the
next cell's worker, whichever it is, gets the same breakpoints. While the cell runs, requests go
to its worker (a stopped cell's stack, scopes and variables, continue, the steps) and the
worker's events go to the frontend among the cell's.

Cells are files named as `worker.cellfiles` says; `dumpCell` writes one on this host, where the
worker's debugger looks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import WorkerDied
from ..tasks import Background, within
from ..worker import cellfiles
from ..worker.bookkeeping import is_bookkeeping
from ..worker.messages import DebugCells, DebugPort, WorkerNotice

if TYPE_CHECKING:
    from .cells import EventSink
    from .pool import WorkerHandle

log = logging.getLogger(__name__)

CALL_TIMEOUT = 30.0  # seconds a request to a worker's debugger waits for its response
START_TIMEOUT = 30.0  # seconds a worker takes to start its debugger and take the connection
FRAME_LIMIT = 64 * 2**20  # bytes of one message from a worker's debugger, at most
# What the session's debugger serves: debugpy's, but for what lives beyond one cell's connection
# and is not kept for the next (function breakpoints, the modules list)
CAPABILITIES = {
    "supportsConfigurationDoneRequest": True, "supportsConditionalBreakpoints": True,
    "supportsHitConditionalBreakpoints": True, "supportsLogPoints": True,
    "supportsEvaluateForHovers": True, "supportsSetVariable": True,
    "supportsSetExpression": True, "supportsCompletionsRequest": True,
    "supportsExceptionInfoRequest": True, "supportsExceptionOptions": True,
    "supportsDelayedStackTraceLoading": True, "supportsValueFormattingOptions": True,
    "supportsStepInTargetsRequest": True, "supportsGotoTargetsRequest": True,
    "exceptionBreakpointFilters": [
        {"filter": "raised", "label": "Raised Exceptions", "default": False},
        {"filter": "uncaught", "label": "Uncaught Exceptions", "default": True},
        {"filter": "userUnhandled", "label": "User Uncaught Exceptions", "default": False},
    ],
}
# llfabric's own frames (the worker's runtime) are not the user's code to step through
ATTACH = {"justMyCode": True, "subProcess": False,
          "rules": [{"path": str(Path(__file__).resolve().parents[1]), "include": False}]}
DapMessage = dict[str, Any]  # one Debug Adapter Protocol message, as its JSON reads
HANDSHAKE_EVENTS = frozenset({"initialized", "process", "output", "debugpySockets",
                              "debugpyWaitingForServer"})  # of the connection, not the cell


def response(request: DapMessage, body: dict | None = None,
             error: str | None = None) -> DapMessage:
    """The response to `request`: `body`, or its failure (`error`)."""
    reply: dict[str, Any] = {"type": "response", "seq": 0, "request_seq": request.get("seq", 0),
                             "command": request.get("command"), "success": error is None,
                             "body": body or {}}
    if error is not None:
        reply["message"] = error
    return reply


class Debugger:
    """The debug session of one notebook session's frontend."""

    def __init__(self) -> None:
        self.started = False  # the frontend attached, and has not disconnected since
        self.breakpoints: dict[str, dict] = {}  # source path -> its setBreakpoints arguments
        self.exceptions: dict | None = None  # the setExceptionBreakpoints arguments
        self.link: DebugConnection | None = None  # to the running cell's worker, while it runs
        self._turn = asyncio.Lock()  # a request waits while a cell's worker is connected

    async def request(self, message: DapMessage) -> DapMessage:
        """The response to a frontend's request."""
        command, arguments = message.get("command"), message.get("arguments") or {}
        if not isinstance(command, str) or not isinstance(arguments, dict):
            return response(message, error="a debug request has a command and arguments")
        async with self._turn:
            link = self.link
            local = self._answer(command, arguments, message, link)
            if command == "disconnect":  # a stopped cell runs on, without breakpoints
                self.link = None
        if command == "disconnect" and link is not None:
            await link.close()
        if local is not None:
            return local
        if link is None:
            return response(message, error=f"{command}: no cell of the session is running "
                            "under the debugger")
        answer = await link.call(message)
        if command == "variables" and isinstance(answer.get("body"), dict):
            # the cell's values, without IPython's (In, Out, exit...), as a kernel shows them
            variables = answer["body"].get("variables") or []
            answer["body"]["variables"] = [v for v in variables if isinstance(v, dict)
                                           and not is_bookkeeping(str(v.get("name")))]
        return answer

    def _answer(self, command: str, arguments: dict, message: dict,
                link: DebugConnection | None) -> dict | None:
        """What the session answers itself (None: the running cell's debugger answers), and
        what it keeps of the frontend's set-up."""
        match command:
            case "initialize":
                return response(message, CAPABILITIES)
            case "attach":
                self.started = True
                return response(message)
            case "disconnect":
                self.started, self.breakpoints, self.exceptions = False, {}, None
                return response(message)
            case "configurationDone":  # the cell's connection is configured as it starts
                return response(message)
            case "debugInfo":
                return response(message, self._info(link))
            case "dumpCell":
                code = arguments.get("code")
                if not isinstance(code, str):
                    return response(message, error="dumpCell needs the cell's code")
                return response(message, {"sourcePath": cellfiles.dump(code)})
            case "setBreakpoints":
                path = (arguments.get("source") or {}).get("path")
                if not isinstance(path, str):
                    return response(message, error="setBreakpoints needs a source path")
                if arguments.get("breakpoints"):
                    self.breakpoints[path] = arguments
                else:
                    self.breakpoints.pop(path, None)
                return None if link is not None else response(message, {"breakpoints": [
                    {"verified": True, "line": b.get("line"), "source": {"path": path}}
                    for b in arguments.get("breakpoints") or [] if isinstance(b, dict)]})
            case "setExceptionBreakpoints":
                self.exceptions = arguments
                return None if link is not None else response(message, {"breakpoints": []})
            case "richInspectVariables" | "copyToGlobals" | "modules":
                return response(message, error=f"{command} is not served by llfabric")
            case "source" if link is None:
                return self._source(message, arguments)
        return None

    def _info(self, link: DebugConnection | None) -> dict:
        return {"isStarted": self.started, "hashMethod": "Murmur2", "hashSeed": cellfiles.SEED,
                "tmpFilePrefix": cellfiles.prefix(), "tmpFileSuffix": cellfiles.SUFFIX,
                "breakpoints": [{"source": path, "breakpoints": arguments["breakpoints"]}
                                for path, arguments in self.breakpoints.items()],
                "stoppedThreads": sorted(link.stopped) if link is not None else [],
                "richRendering": False, "exceptionPaths": ["Python Exceptions"],
                "copyToGlobals": False}

    @staticmethod
    def _source(message: dict, arguments: dict) -> dict:
        """A cell's source between cells (only cells: the running cell's debugger reads the
        rest)."""
        path = (arguments.get("source") or {}).get("path")
        if isinstance(path, str) and path.startswith(cellfiles.prefix()) \
                and Path(path).is_file():
            return response(message, {"content": Path(path).read_text(encoding="utf-8")})
        return response(message, error="source unavailable")

    # a cell's connection
    async def join(self, worker: WorkerHandle, events: EventSink) -> None:
        """Before a cell runs on `worker` while the frontend debugs: connect to the worker's
        debugger and set it up as the frontend did. A worker that cannot debug runs the cell
        all the same; the frontend is told why it does not stop."""
        if not self.started:
            if worker.debugged:  # debugged before: its cells run untraced from now on
                await self._ask(worker, DebugCells(trace=False), events)
            return
        async with self._turn:
            reply = await self._ask(worker, DebugCells(), events)
            try:
                if reply.error is not None:
                    raise ConnectionError(reply.error)
                worker.debugged = True
                self.link = await within(
                    DebugConnection.open(reply.port, events, self.breakpoints, self.exceptions),
                    START_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                events.notice("debugger", f"the cell runs without the debugger: its worker's "
                              f"debugger did not start ({exc})")

    @staticmethod
    async def _ask(worker: WorkerHandle, message: DebugCells, events: EventSink) -> DebugPort:
        await worker.send(message)
        reply = await worker.recv(timeout=START_TIMEOUT)
        while isinstance(reply, WorkerNotice):
            events.notice(reply.topic, reply.text)
            reply = await worker.recv(timeout=START_TIMEOUT)
        if not isinstance(reply, DebugPort):
            raise WorkerDied(f"worker {worker.pid} answered debug with {reply.op!r}")
        return reply

    async def leave(self) -> None:
        """After the cell: disconnect from its worker's debugger (the worker may go on
        without it)."""
        async with self._turn:
            link, self.link = self.link, None
        if link is not None:
            await link.close()


class DebugConnection:
    """One connection to a worker's debug adapter, for the length of one cell.

    Requests are numbered on this connection (the frontend's numbers are put back in their
    responses); events go to the cell's events, but for the connection's own."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 events: EventSink) -> None:
        self.reader, self.writer, self.events = reader, writer, events
        self.stopped: set[int] = set()  # the threads stopped now
        self.paths: list[str] = []  # the sources given breakpoints
        self.initialized = asyncio.Event()
        self._seq = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._tasks = Background("a cell's debugger connection")  # ended by `close`
        self._reading = self._tasks.start(self._read(), "reading its messages")

    @classmethod
    async def open(cls, port: int, events: EventSink, breakpoints: dict[str, dict],
                   exceptions: dict | None) -> DebugConnection:
        """Connect and configure: the frontend's breakpoints and exception filters."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=FRAME_LIMIT)
        link = cls(reader, writer, events)
        try:
            await link._check(link.request("initialize", {
                "clientID": "llfabric", "adapterID": "python", "pathFormat": "path",
                "linesStartAt1": True, "columnsStartAt1": True}))
            # the adapter answers attach only once configured, after its `initialized` event
            attached = link._tasks.start(link.request("attach", ATTACH))
            async with asyncio.TaskGroup() as group:
                initialized = group.create_task(link.initialized.wait())
                await asyncio.wait({attached, initialized}, return_when=asyncio.FIRST_COMPLETED)
                initialized.cancel()
            for arguments in breakpoints.values():
                await link._check(link.request("setBreakpoints", arguments))
                link.paths.append(arguments["source"]["path"])
            if exceptions is not None:
                await link._check(link.request("setExceptionBreakpoints", exceptions))
            await link._check(link.request("configurationDone"))
            await link._check(attached)
        except BaseException:
            await link.close(disconnect=False)
            raise
        return link

    async def request(self, command: str, arguments: dict | None = None) -> DapMessage:
        return await self.call({"seq": 0, "type": "request", "command": command,
                                "arguments": arguments or {}})

    @staticmethod
    async def _check(pending: Any) -> DapMessage:
        answer = await pending
        if not answer.get("success"):
            raise ConnectionError(f"{answer.get('command')}: {answer.get('message')}")
        return answer

    async def call(self, message: DapMessage, timeout: float = CALL_TIMEOUT) -> DapMessage:
        """The worker debugger's response to `message` (renumbered on this connection)."""
        seq = next(self._seq)
        waiting = self._waiting[seq] = asyncio.get_running_loop().create_future()
        body = json.dumps({**message, "seq": seq}).encode()
        try:
            self.writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await self.writer.drain()
            answer = await within(waiting, timeout)
        except (ConnectionError, TimeoutError) as exc:
            return response(message, error=f"the cell's debugger did not answer ({exc})")
        finally:
            self._waiting.pop(seq, None)
        return {**answer, "request_seq": message.get("seq", 0)}

    async def _read(self) -> None:
        try:
            while True:
                message = await self._frame()
                if message.get("type") == "response":
                    waiting = self._waiting.get(message.get("request_seq", 0))
                    if waiting is not None and not waiting.done():
                        waiting.set_result(message)
                elif message.get("type") == "event":
                    self._event(message)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            log.debug("the cell's debugger connection ended: %s", exc)
        finally:
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_exception(ConnectionError("the worker's debugger went away"))
            self._resumed()

    async def _frame(self) -> dict:
        """One message: `Content-Length` headers, a blank line, that many bytes of JSON."""
        length = None
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("ascii").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if length is None or not 0 <= length <= FRAME_LIMIT:
            raise ValueError(f"a debug adapter message of length {length}")
        message = json.loads(await self.reader.readexactly(length))
        if not isinstance(message, dict):
            raise ValueError("a debug adapter message that is not an object")
        return message

    def _event(self, message: dict) -> None:
        event, body = message.get("event"), message.get("body") or {}
        if event == "initialized":
            self.initialized.set()
        if event in HANDSHAKE_EVENTS:
            return
        if event == "stopped" and isinstance(body.get("threadId"), int):
            self.stopped.add(body["threadId"])
        elif event == "continued":
            if body.get("allThreadsContinued", True):
                self.stopped.clear()
            else:
                self.stopped.discard(body.get("threadId"))
        self.events({"content": message}, "debug")

    def _resumed(self) -> None:
        """The connection is over: a frontend that saw the cell stop sees it go on."""
        if self.stopped:
            self.stopped.clear()
            self.events({"content": {"type": "event", "seq": 0, "event": "continued",
                                     "body": {"threadId": 0, "allThreadsContinued": True}}},
                        "debug")

    async def close(self, disconnect: bool = True) -> None:
        """End the connection (`disconnect`: first telling the adapter, which resumes the
        cell's threads and forgets its breakpoints)."""
        if disconnect and not self._reading.done():
            with contextlib.suppress(ConnectionError, TimeoutError, OSError):
                await self.call({"seq": 0, "type": "request", "command": "disconnect",
                                 "arguments": {"restart": False, "terminateDebuggee": False}},
                                timeout=5.0)
        self.writer.close()
        await self._tasks.close()  # the reader, and an attach request still waiting
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()
        self._resumed()

"""The relay between an ipykernel and a fabric session: cells go out, outputs come back.

Outputs arrive as nbformat output dicts and are re-published on the kernel's IOPub channel with
the request's parent header, so frontends cannot tell them from the kernel's own. The kernel's
namespace is never used: what a cell defines lives in the session's store.

A cell keeps running on the fabric when the kernel that sent it dies: the kernel started in its
place follows it (`Follow`) before its first cell, which shows that cell's outputs so far and its
live ones (under a line that says where they come from), then runs once it has ended. They go
out as the first cell's own outputs because a notebook shows only outputs whose parent is one of
its execute requests: published at the kernel's start, with no parent, they would be lost.

While a cell runs, a Jupyter interrupt (SIGINT, delivered as KeyboardInterrupt in the kernel's
main thread while it waits for the server) becomes an `interrupt` request, and a server that stops
answering is noticed by a ping after ten seconds of silence.

What llfabric says about itself (a wait for an execution slot, a value only its worker holds)
goes to the kernel's log and `%llfabric status`, never into the cell's outputs (see
`fabric.notices`), so an attached notebook's outputs are a plain kernel's.
"""

from __future__ import annotations

import logging
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from IPython.core.error import StdinNotImplementedError
from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult, InteractiveShell

from ..client import PATIENCE, Client, Events, listening
from ..errors import FabricError, RemoteError, Unreachable
from ..messages import (
    Answer,
    Comm,
    DebugEvent,
    Executed,
    Followed,
    InputRequest,
    Interrupt,
    Notice,
    Output,
    Queued,
    Reply,
)
from ..output_limit import Budget
from ..status import SessionStatus
from .answers import Answers
from .busy import Busy
from .debugging import Debugging
from .frontend import Frontend
from .kernels import ENV_VARIABLE
from .notebook_file import next_cell_source
from .routing import is_local

if TYPE_CHECKING:
    from ipykernel.zmqshell import ZMQInteractiveShell

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Reply)

SILENCE = 10.0  # seconds without a frame before the relay pings, and before it gives up
CALL_TIMEOUT = 10.0


class RemoteCellError(Exception):
    """Stands, in the kernel's execute_reply, for what the cell raised in its worker."""


def _remote_error(ename: str, evalue: str) -> RemoteCellError:
    name = ename if ename.isidentifier() else "RemoteCellError"
    return type(name, (RemoteCellError,), {})(evalue)


class Attachment:
    """One kernel attached to one session of the fabric at `address`."""

    def __init__(self, shell: InteractiveShell, address: str, session: str,
                 notebook: Path | None) -> None:
        self.shell = shell
        # the cast: an ipykernel's shell, as `require_kernel` checked; IPython's type has no kernel
        self.kernel = typing.cast("ZMQInteractiveShell", shell).kernel
        self.address = address
        self.session = session
        self.notebook = notebook
        self.client = Client(address, timeout=CALL_TIMEOUT)
        self.opened = False
        self.follow = False  # a cell of the session may still run: follow it before the next
        # the session's GPU count (`%llfabric gpus`), sent with every cell so that a restarted
        # server keeps it; None: the server's
        self.gpus: int | None = None
        self.answers = Answers(self)
        self.frontend = Frontend(self)  # the comms of a JupyterLab extension
        self.busy = Busy(self.kernel)  # the kernel's status while a cell runs
        self.debugging = Debugging(self)  # the frontend's debugger, on the session's workers

    def close(self, forget: bool = True) -> None:
        """Detach; with `forget`, the server also retires the session's workers (the store
        keeps its state)."""
        if forget and self.opened:
            try:
                self.client.close_session(self.session, timeout=2.0)
            except FabricError as exc:
                print(f"llfabric: detached, but the server did not close the session: "
                      f"{exc.message}", file=sys.stderr)
        self.client.close()

    def open(self) -> SessionStatus:
        """Open (or rejoin) the session; the kernel's prompt numbers continue the session's."""
        self._check_reachable()
        reply = self.client.open(self.session, os.getcwd(), os.environ.get(ENV_VARIABLE))
        self.opened = True
        self.follow = True
        self.shell.execution_count = reply.execution_count + 1
        self.answers.load_history()
        return reply

    def _check_reachable(self) -> None:
        """A server that is down is said within a second, before the cell is sent, rather
        than after the relay's patience with a cell that runs; one that listens but answers
        late (a loaded host) is waited for (`Client.answers`)."""
        if self.client.answers():
            return
        if listening(self.address):
            raise FabricError(f"the llfabric server at {self.address} accepts connections but "
                              f"has not answered for {PATIENCE:.0f} s; the cell was not sent",
                              address=self.address)
        raise Unreachable(f"no llfabric server answers at {self.address}; the cell was not "
                          "sent", address=self.address)

    def checked_out(self) -> str | None:
        """After a checkout: the widgets the frontend shows belong to a worker no longer the
        session's, with the values from before it; they are closed rather than left to show
        values the session no longer has. What to tell the user, if any were."""
        cells = self.answers.close_comms()
        if not cells:
            return None
        plural = "s" if len(cells) > 1 else ""
        prompts = ", ".join(f"[{count}]" for count in cells)
        return (f"the widgets shown by cell{plural} {prompts} held the values from before the "
                f"checkout and are closed; run the cell{plural} again for live ones")

    # cells
    def run(self, source: str, cell_id: str | None = None) -> ExecutionResult:
        """Run one cell on the fabric, publishing its outputs; the result ipykernel replies with.

        The frontend comms keep the cell's id, request and outputs while it runs, for a notebook
        reopened meanwhile (its own tab closed): it shows them and follows the cell."""
        count = self.shell.execution_count  # the number the kernel announced for this cell
        parent = self.kernel.get_parent("shell") or {}
        self.frontend.cell_started(cell_id, (parent.get("header") or {}).get("msg_id"), count,
                                   source)
        result: ExecutionResult | None = None
        try:
            with self.busy.running(parent):
                result = self._run(source, cell_id, count)
            return result
        finally:
            failed = result is None or result.error_in_exec is not None
            ended = None if result is None else result.execution_count
            self.frontend.cell_ended(count if ended is None else ended,
                                     "error" if failed else "ok")

    def _run(self, source: str, cell_id: str | None, count: int) -> ExecutionResult:
        result = ExecutionResult(ExecutionInfo(source, True, False, True, cell_id))
        try:
            if self.opened:
                self._check_reachable()
            else:
                self.open()
            count = self._follow_running(count)
            try:
                reply = self._execute(source, count, result)
            except RemoteError as exc:
                if exc.kind != "unknown_session":
                    raise
                self.open()  # the server restarted: the session continues from the store
                reply = self._execute(source, count, result)
        except FabricError as exc:
            self._fail(result, exc)
            return self._numbered(result, count)
        except KeyboardInterrupt:  # before the cell reached the server: it did not run
            self._fail(result, FabricError("interrupted before the cell started"))
            return self._numbered(result, count)
        count = reply.execution_count
        self._numbered(result, count)
        self.answers.record(count, source)
        self.frontend.started(cell_id, count, reply.start)
        self._relay_payloads(reply.payload)
        if reply.status == "error" and result.error_in_exec is None:
            result.error_in_exec = _remote_error(reply.ename or "Error", "")
        self._draft_next(cell_id)
        self.frontend.update()
        return result

    def _numbered(self, result: ExecutionResult, count: int) -> ExecutionResult:
        """A cell takes its number, run or failed, as in a plain kernel; the next one follows."""
        result.execution_count = count
        self.shell.execution_count = count + 1
        return result

    def _relay_payloads(self, payloads: tuple[dict, ...]) -> None:
        """The cell's pager text and next input, for the kernel's execute reply."""
        manager = self.shell.payload_manager  # a kernel's shell has one
        for payload in payloads:
            if manager is not None and isinstance(payload, dict) \
                    and isinstance(payload.get("source"), str):
                manager.write_payload(payload)

    def _follow_running(self, count: int) -> int:
        """Show the outputs of the session's cell that runs on from a kernel gone (or ended
        unseen), and wait for its end; the prompt number for the cell to run after it."""
        if not self.follow:
            return count
        self.follow = False
        shown = ExecutionResult(ExecutionInfo("", True, False, True, None))  # not this cell's
        events = self.client.follow(self.session, timeout=SILENCE)
        header = [True]

        def announce(message: object) -> None:
            if header and not (isinstance(message, Followed) and not message.followed):
                header.clear()
                self.publish("stream", {"name": "stderr", "text": (
                    "llfabric: outputs of the session's cell that was running when this kernel "
                    "started (its own kernel was lost); this cell runs once it ends\n")})

        try:
            reply = self._relay(events, shown, Followed, announce)
        except RemoteError as exc:  # the cell ended in an error of the fabric's (stopped, say)
            if exc.kind == "protocol":  # a server from before `follow`: nothing to follow
                return count
            announce(None)
            self.publish("stream", {"name": "stderr", "text": f"llfabric: {exc.message}\n"})
            return count
        if reply.cell is None:
            return count
        return max(count, reply.cell.execution_count + 1)

    def _execute(self, source: str, count: int, result: ExecutionResult) -> Executed:
        parent = self.kernel.get_parent("shell") or {}
        events = self.client.execute(self.session, source, stdin=True,
                                     cell_id=result.info and result.info.cell_id, gpus=self.gpus,
                                     execution_count=count,
                                     parent_id=(parent.get("header") or {}).get("msg_id"),
                                     timeout=SILENCE)
        return self._relay(events, result, Executed)

    def _relay(self, events: Events, result: ExecutionResult, answer: type[R],
               seen: Callable[[object], None] | None = None) -> R:
        """Publish a cell's events (`seen` first hears of each) until its reply; its outputs
        within their limit (`fabric.output_limit`)."""
        budget = Budget()
        while True:
            try:
                for message in events:
                    if seen is not None:
                        seen(message)
                    match message:
                        case Reply():
                            if (summary := budget.summary()) is not None:
                                self._publish_output(summary, result)
                            assert isinstance(message, answer)  # the events' own answer
                            return message
                        case Output(output=output):
                            if (kept := budget.admit(output)) is not None:
                                self._publish_output(kept, result)
                        case Comm():
                            self.publish_event(message)
                        case DebugEvent(content=content):  # for the frontend's debugger
                            self.kernel._publish_debug_event(content)
                        case Queued(ahead=ahead):
                            self._log(f"waiting for an execution slot, {ahead} cells of other "
                                      "sessions ahead", "queued")
                        case Notice(topic="dropped", text=text):  # a follower's gap
                            self.publish("stream", {"name": "stderr",
                                                    "text": f"llfabric: {text}\n"})
                        case Notice(topic=topic, text=text):
                            self._log(text, topic)
                        case InputRequest():
                            self._answer(message, events)
                # an interrupt landed as the reply was read: the cell is over, its reply lost
                raise FabricError("the cell ended as it was interrupted", session=self.session)
            except KeyboardInterrupt:  # Jupyter's interrupt: the cell's worker gets it
                events.send(Interrupt(self.session))
            except Unreachable as exc:
                raise Unreachable(f"the llfabric server at {self.address} stopped answering "
                                  "while the cell ran; the session keeps the state of the cells "
                                  "before it", address=self.address) from exc

    def _answer(self, request: InputRequest, events: Events) -> None:
        """Ask the frontend through the kernel's stdin channel, as the cell's own input() would."""
        try:
            if request.password:
                value = self.kernel.getpass(request.prompt)
            else:
                value = self.kernel.raw_input(request.prompt)
        except StdinNotImplementedError as exc:
            events.send(Answer(self.session, error=str(exc)))
            return
        events.send(Answer(self.session, value=str(value)))

    def _log(self, text: str, topic: str) -> None:
        """The kernel's log and the frontend's notifications: where a kernel's own news goes,
        apart from the notebook."""
        getattr(self.kernel, "log", log).warning("llfabric: session %s: %s", self.session, text)
        self.frontend.notice(text, topic)  # a notification in JupyterLab

    # publishing
    def publish(self, msg_type: str, content: dict, metadata: dict | None = None,
                buffers: list[bytes] | None = None) -> None:
        """Send on IOPub as the kernel does for the execute request being handled."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # what the kernel itself printed comes first
        seq = self.frontend.record(msg_type, content)  # an output of the running cell
        if seq is not None:
            metadata = {**(metadata or {}), "llfabric_seq": seq}
        kernel = self.kernel
        kernel.session.send(kernel.iopub_socket, msg_type, content,
                            parent=kernel.get_parent("shell"), ident=kernel._topic(msg_type),
                            buffers=buffers or None, metadata=metadata)

    def publish_event(self, event: Output | Comm) -> None:
        """An output or a comm message of the session's worker, as the kernel's own."""
        if isinstance(event, Comm):
            running = self.frontend.running  # None: a callback's, between cells
            self.answers.comm_seen(event.msg_type, event.content,
                                   None if running is None else running.execution_count)
            self.publish(event.msg_type, event.content, event.metadata, event.buffers)
        else:
            self.publish(event.output["output_type"],
                         {k: v for k, v in event.output.items() if k != "output_type"})

    def _publish_output(self, output: dict, result: ExecutionResult) -> None:
        if output["output_type"] == "error":
            traceback = output.get("traceback")
            # IPython sets it (showtraceback) without declaring it
            self.shell._last_traceback = (  # pyright: ignore[reportAttributeAccessIssue]
                traceback if isinstance(traceback, list) else [])
            result.error_in_exec = _remote_error(str(output.get("ename", "Error")),
                                                 str(output.get("evalue", "")))
        self.publish_event(Output(output))

    def _fail(self, result: ExecutionResult, exc: FabricError) -> None:
        """The fabric could not run the cell: say so in the cell, as its error."""
        if isinstance(exc, Unreachable):
            text = (f"{exc.message}. Start a server with `llfabric serve`, then run the cell "
                    "again; `%%local` runs a cell in this kernel instead.")
        elif exc.kind == "busy":
            text = (f"{exc.message} (perhaps from before a kernel restart). Wait for it, or "
                    "stop it with `%llfabric interrupt`; this cell did not run.")
        else:
            text = f"llfabric could not run the cell: {exc.message}"
        error = {"ename": "LLFabricError", "evalue": text, "traceback": [f"llfabric: {text}"]}
        self._publish_output({"output_type": "error", **error}, result)

    # drafts
    def draft(self, source: str) -> None:
        """Have the fabric prepare a worker for `source` (the next cell, or one being edited)."""
        if is_local(source) or not self.opened:
            return
        try:
            self.client.draft(self.session, source, timeout=CALL_TIMEOUT)
        except FabricError as exc:  # a draft only saves time: the cell runs without it
            log.info("draft not sent: %s", exc.message)

    def _draft_next(self, cell_id: str | None) -> None:
        if cell_id and self.notebook is not None:
            source = next_cell_source(self.notebook, cell_id)
            if source is not None and source.strip():
                self.draft(source)

"""The messages of the client <-> server wire, each defined once; both ends use them.

A message is a frozen dataclass. ``to_wire(msg_id)`` builds its msgpack map (framing:
`fabric.protocol`); ``from_wire(map)`` checks the map on receipt (each field present if required,
of its declared type) and raises `ProtocolError` for anything else. An unknown op, event or frame
type is an error, never dropped.

Requests (client -> server) carry ``op``, ``msg_id`` and the fields of their dataclass. A field
name has one type on this wire: a field a request does not use is still checked, then ignored.

The server answers each request with zero or more ``event`` frames and exactly one final frame,
``reply`` (its fields depend on the op) or ``error`` (``error``: a `FabricError`'s wire map), all
carrying the request's ``msg_id``. The events of an ``execute``: `Output` (an nbformat output),
`Comm` (a comm message), `Queued` (the cell waits for a lease), `Leased` (it got one),
`InputRequest` (the cell called input() or getpass(); answered by an `Answer` of the same
session, only when the execute said ``stdin``), `DebugEvent` (see `Debug`) and `Notice` (what
llfabric says about itself, never a cell output; see `fabric.notices`).

While a client's cell runs, the server probes it with `Heartbeat` frames (no msg_id) and ZMTP
pings. A cell whose client is gone or silent runs on for the server's ``detached_grace`` seconds
(0: it is stopped at once), then is stopped unless a client follows it. ``follow`` (`Follow`)
takes over a session's running cell, or the reply of one that ended while no client followed
it: its answer is the cell's events kept so far (the newest ``fabric.following.KEEP_BYTES``; a
``dropped`` `Notice` first says how many were not kept), then its live events, then the cell's
own final frame (a reply also carries ``followed``: true), or at once a reply with ``followed``
false when there is nothing to follow. Input requests are not kept; one made while no client
follows the cell is answered as stdin not available.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from . import typed
from .errors import ProtocolError, RemoteError
from .protocol import Wire, is_map, valid_session_name

Version = int | str  # a version number, or a name `Tag` gave one

# nbformat's output types, what frontends apply to them, and what a kernel's pager shows
OUTPUT_TYPES = frozenset({"stream", "display_data", "update_display_data", "execute_result",
                          "error", "clear_output"})
COMM_TYPES = frozenset({"comm_open", "comm_msg", "comm_close"})

_WORDS: dict[object, str] = {str: "a string", bool: "a boolean", int: "an integer",
                             float: "a number", Wire: "a map", Version: "an integer or a name"}


def _required(hint: Any) -> Any:
    """`X | None` -> X."""
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return functools.reduce(lambda a, b: a | b, args) if len(args) > 1 else args[0]
    return hint


class Message:
    """A message of this wire: a frozen dataclass whose fields' types are what `from_wire`
    checks on receipt."""

    # what `@dataclass` sets on each subclass, declared so the checker reads them as dataclasses
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @classmethod
    @functools.cache
    def wire_types(cls) -> dict[str, Any]:
        """Each field's type, None stripped: an optional field is absent, never nil."""
        hints = typing.get_type_hints(cls)
        return {f.name: _required(hints[f.name]) for f in dataclasses.fields(cls)}

    @classmethod
    def _required_fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]

    @classmethod
    def _build(cls, message: Wire, where: str, checked: dict[str, Any]) -> Self:
        for name in cls._required_fields():
            if name not in message:
                raise ProtocolError(f"{where} needs field {name!r}")
        for name, kind in checked.items():
            try:
                if name in message:
                    typed.check(message[name], kind, name)
            except typed.Mismatch:
                raise ProtocolError(f"field {name!r} must be {_WORDS.get(kind, kind)}") from None
        return cls(**{name: message[name] for name in cls.wire_types() if name in message})

    def _fields(self) -> dict[str, Any]:
        """The fields that go on the wire: an unset optional one stays off it."""
        values = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return {name: value for name, value in values if value is not None}


class Record:
    """A record of the wire, a frozen dataclass read by `from_wire`: every field it declares is
    checked against its type (a float accepts an int, a tuple a list, a nested record is read as
    its own); keys it does not declare are ignored, so a newer server may add one; a field that
    is missing or of the wrong type is a `ProtocolError` naming it, never a KeyError deep in a
    reader."""

    @classmethod
    def from_wire(cls, raw: object) -> Self:
        if not is_map(raw):
            raise ProtocolError(f"{cls.__name__} must be a map, not {type(raw).__name__}")
        try:
            return cls(**typed.record(cls, raw, cls.__name__))
        except typed.Mismatch as exc:
            owner, _, key = exc.where.rpartition(".")
            if exc.missing:
                raise ProtocolError(f"{owner} lacks {key!r}", key=key) from None
            raise ProtocolError(f"field {exc.where} should be {exc.expected}, "
                                f"not {exc.value!r}"[:300], field=exc.where) from None

    def to_map(self) -> Wire:
        """The record as the wire carries it (an optional field left unset stays off it)."""
        return _plain(self)


def _plain(value: object) -> Any:
    """`value` as msgpack carries it: records as maps, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(v) for f in dataclasses.fields(value)
                if (v := getattr(value, f.name)) is not None or f.default is dataclasses.MISSING}
    if isinstance(value, list | tuple):  # the cast: isinstance cannot type the items
        return [_plain(v) for v in typing.cast(Sequence[object], value)]
    if is_map(value):
        return {k: _plain(v) for k, v in value.items()}
    return value


# Requests


class Request(Message):
    op: ClassVar[str]

    def to_wire(self, msg_id: str) -> Wire:
        return {"op": self.op, "msg_id": msg_id, **self._fields()}

    @staticmethod
    def from_wire(message: Wire) -> Request:
        """The request a client sent, checked; ProtocolError (its `op` named) if it is none."""
        op = message.get("op")
        if not isinstance(op, str):
            raise ProtocolError("request has no 'op'")
        if op not in REQUESTS:
            raise ProtocolError(f"unknown op {op!r}", op=op)
        try:
            if not isinstance(message.get("msg_id"), str):
                raise ProtocolError("request has no string 'msg_id'")
            request = REQUESTS[op]._build(message, f"op {op!r}", REQUEST_FIELDS)
            session = message.get("session")
            if session is not None and not valid_session_name(session):
                raise ProtocolError(
                    "session names are 1-128 characters of letters, digits, '-', '_' and '.'")
        except ProtocolError as exc:
            raise ProtocolError(exc.message, op=op) from None
        return request


@dataclass(frozen=True)
class Open(Request):
    """Open a session (or rejoin it); the reply is its status."""

    op = "open"
    session: str
    cwd: str | None = None  # where its cells run; default the server's
    # the user's environment its next cells import from ("": the server's packages); None: as
    # before, or what its head version ran in
    env: str | None = None


@dataclass(frozen=True)
class Draft(Request):
    """The cell being edited: prepare a worker holding its closure."""

    op = "draft"
    session: str
    source: str


@dataclass(frozen=True)
class Execute(Request):
    """Run a cell and commit its state; events stream until the reply (status, timings)."""

    op = "execute"
    session: str
    source: str
    stdin: bool = False  # the client answers the cell's input() (see `InputRequest`)
    cell_id: str | None = None  # the frontend's id of the cell, where it has one
    gpus: int | None = None  # slots this and the session's later cells lease; None: as before
    # the prompt number the frontend shows (its kernel's own cells take numbers too);
    # None: the one after the session's last cell
    execution_count: int | None = None
    # the frontend's request (its Jupyter msg_id), under which the cell's output widgets
    # capture what it outputs, as in a kernel
    parent_id: str | None = None


@dataclass(frozen=True)
class Follow(Request):
    """Follow the session's running cell (its client went away): what it output so far, then
    its live events and reply; see the top of this module."""

    op = "follow"
    session: str


@dataclass(frozen=True)
class Interrupt(Request):
    op = "interrupt"
    session: str


@dataclass(frozen=True)
class Stop(Request):
    """Stop the session's running cell now (its worker killed, its state not committed),
    whichever client ran it; the reply comes once it is over (``stopped``: whether one ran)."""

    op = "stop"
    session: str


@dataclass(frozen=True)
class Answer(Request):
    """The answer to a running cell's input(): `value`, or the `error` its input() raises."""

    op = "input"
    session: str
    value: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Checkout(Request):
    op = "checkout"
    session: str
    version: Version


@dataclass(frozen=True)
class Close(Request):
    op = "close"
    session: str


@dataclass(frozen=True)
class Tag(Request):
    """Name `version` (default: the head): retention keeps it."""

    op = "tag"
    session: str
    name: str
    version: Version | None = None


@dataclass(frozen=True)
class Remove(Request):
    """Remove the session from the store; refused while a cell of it runs."""

    op = "rm"
    session: str


@dataclass(frozen=True)
class Complete(Request):
    """Jupyter's completion of `source` at `cursor`: a `complete_reply`'s content, from the
    session's live worker, else from its head's catalog (`snapshot.catalog`)."""

    op = "complete"
    session: str
    source: str
    cursor: int


@dataclass(frozen=True)
class Inspect(Request):
    """Jupyter's inspection of the name at `cursor` in `source`: an `inspect_reply`'s content,
    from the live worker, else the catalog (`detail` 1: with its source, where a worker has it)."""

    op = "inspect"
    session: str
    source: str
    cursor: int
    detail: int = 0


@dataclass(frozen=True)
class CommMessage(Request):
    """A frontend's `comm_msg` or `comm_close` to a comm a cell opened (a widget moved), for
    the session's live worker; the reply says whether one took it, its events are what the
    comm's callbacks output."""

    op = "comm"
    session: str
    msg_type: str
    content: Wire
    buffers: list[bytes] | None = None
    parent_id: str | None = None  # the frontend's request: see `Execute`


@dataclass(frozen=True)
class Debug(Request):
    """A frontend's debugger request (a Jupyter `debug_request`'s content: a debug adapter
    protocol request), served for the session's cells (`pool.debugging`); the reply's
    ``content`` is the `debug_reply`'s. While a cell runs under the debugger, its execute's
    `DebugEvent`s are the debugger's events."""

    op = "debug"
    session: str
    content: Wire


@dataclass(frozen=True)
class History(Request):
    """The session's cells, oldest first: `[execution_count, source]` of each version that ran
    one, across kernel restarts; open or not."""

    op = "history"
    session: str


@dataclass(frozen=True)
class Versions(Request):
    """The session's versions, newest first, each described for a history view: its cell's
    prompt number and first line, when, its size, and which variables it changed; open or
    not."""

    op = "versions"
    session: str


@dataclass(frozen=True)
class Status(Request):
    op = "status"


@dataclass(frozen=True)
class Holds(Request):
    """How many bytes of a session's state this host holds (of the closure of `source`, else
    of its head): a cluster's front door places the session by it. The reply: ``bytes`` on
    this host's disk, ``memory`` in a worker it keeps for the session."""

    op = "holds"
    session: str
    source: str = ""


@dataclass(frozen=True)
class Drain(Request):
    """Move every session off `host` and open no new one there (a cluster's front door);
    `undo`: let it take sessions again."""

    op = "drain"
    host: str
    undo: bool = False


@dataclass(frozen=True)
class Emigrate(Request):
    """Close `user`'s session here for another host, whose server wakes restored workers in
    `wake_dir`: a worker that alone holds unsaveable values is dumped first, its image put in
    this host's store for that host to fetch (the reply's ``image``; null when there was none).
    Only a cluster's front door sends it, as the user who runs the hosts."""

    op = "emigrate"
    session: str
    user: str
    wake_dir: str


@dataclass(frozen=True)
class Immigrate(Request):
    """Restore, on demand, the worker `image` (an `emigrate` reply's) into `user`'s session,
    open here at the version it was dumped at (a cluster's front door, as for `Emigrate`)."""

    op = "immigrate"
    session: str
    user: str
    image: Wire


@dataclass(frozen=True)
class GiveUp(Request):
    """Close every session open here, stopping the cells they run: a cluster's front door lost
    this host (silent, cut off or paused), and its sessions opened elsewhere, or open here again
    from the store's newest version. The door sends it, as the user who runs the hosts, before
    it takes the host back."""

    op = "give_up"


@dataclass(frozen=True)
class Ping(Request):
    op = "ping"


REQUESTS: dict[str, type[Request]] = {cls.op: cls for cls in (
    Open, Draft, Execute, Follow, Interrupt, Stop, Answer, Checkout, Close, Tag, Remove, Complete,
    Inspect, CommMessage, Debug, History, Versions, Status, Ping, Holds, Drain, Emigrate,
    Immigrate, GiveUp)}
CLIENT_OPS = frozenset(REQUESTS)


def _field_types(classes: typing.Iterable[type[Message]]) -> dict[str, Any]:
    """One type per field name across `classes`; two that disagree are a bug here."""
    table: dict[str, Any] = {}
    for cls in classes:
        for name, kind in cls.wire_types().items():
            if table.setdefault(name, kind) != kind:
                raise TypeError(f"field {name!r} has two types: {table[name]}, {kind}")
    return table


REQUEST_FIELDS = _field_types(REQUESTS.values())


def request(op: str, **fields: Any) -> Request:
    """A request named by its op (a command line's, a magic's), checked as the server will."""
    return Request.from_wire({"op": op, "msg_id": "", **fields})


# What the server sends


class Event(Message):
    event: ClassVar[str]

    def to_wire(self, msg_id: str) -> Wire:
        return {"type": "event", "msg_id": msg_id, "event": self.event, **self._fields()}

    @staticmethod
    def from_wire(message: Wire) -> Event:
        """An event frame, checked; ProtocolError if it is none."""
        kind = message.get("event")
        cls = EVENTS.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise ProtocolError(f"unknown event {kind!r}")
        cls._check(message)
        return cls._build(message, f"event {kind!r}", cls.wire_types())

    @classmethod
    def _check(cls, message: Wire) -> None:
        """Checks beyond the fields' types."""


@dataclass(frozen=True)
class Output(Event):
    """An nbformat output of the running cell (``output_type`` and its own fields)."""

    event = "output"
    output: Wire

    @classmethod
    def _check(cls, message: Wire) -> None:
        output = message.get("output")
        if is_map(output) and output.get("output_type") not in OUTPUT_TYPES:
            raise ProtocolError(f"an output of unknown type {output.get('output_type')!r}")


@dataclass(frozen=True)
class Comm(Event):
    """A comm message of the running cell (ipywidgets), for the frontend as a kernel sends it."""

    event = "comm"
    msg_type: str
    content: Wire
    metadata: Wire
    buffers: list[bytes]

    @classmethod
    def _check(cls, message: Wire) -> None:
        if message.get("msg_type") not in COMM_TYPES:
            raise ProtocolError(f"a comm message of unknown type {message.get('msg_type')!r}")


@dataclass(frozen=True)
class Queued(Event):
    """The cell waits for an execution slot: `ahead` cells wait before it, for `slots`."""

    event = "queued"
    ahead: int
    slots: int


@dataclass(frozen=True)
class Leased(Event):
    event = "leased"
    waited: float  # seconds in the queue


@dataclass(frozen=True)
class InputRequest(Event):
    event = "input_request"
    prompt: str
    password: bool = False


@dataclass(frozen=True)
class Notice(Event):
    """What llfabric did, for status and logs (`fabric.notices`)."""

    event = "notice"
    topic: str
    text: str
    time: float

    @classmethod
    def from_wire(cls, message: object) -> Notice:  # type: ignore[override]
        """A notice on its own, as a session's status and a cell's reply list them."""
        if not is_map(message):
            raise ProtocolError("Notice must be a map")
        return cls._build(message, "a notice", cls.wire_types())


@dataclass(frozen=True)
class DebugEvent(Event):
    """An event of the debugger of the running cell's worker (a Jupyter `debug_event`'s
    content: a debug adapter protocol event), such as its stop at a breakpoint."""

    event = "debug"
    content: Wire


EVENTS: dict[str, type[Event]] = {cls.event: cls for cls in (
    Output, Comm, Queued, Leased, InputRequest, Notice, DebugEvent)}


# Replies: each op's final answer (`status.REPLIES` names the reply of each op)


class Reply(Record):
    """A request's final answer."""

    def to_wire(self, msg_id: str | None) -> Wire:
        return {"type": "reply", "msg_id": msg_id, **self.to_map()}


@dataclass(frozen=True)
class Placement(Record):
    """Where a cluster's front door placed a session, and why (`fabric.cluster.placement`)."""

    reason: str
    held: int  # bytes of the cell's closure the host holds
    why: str


@dataclass(frozen=True)
class ClosureSummary(Reply):
    """`draft`'s reply, and an executed cell's closure: what the cell loads of the session."""

    names: tuple[str, ...]
    groups: int
    lazy: int
    whole: bool
    exact: bool
    session_variables: int


@dataclass(frozen=True)
class Executed(Reply):
    """`execute`'s reply: how the cell ended, the version it committed and what it cost."""

    status: str  # ok or error
    ename: str | None
    version: int
    execution_count: int
    unsaved: tuple[str, ...]  # names whose values could not be saved
    notices: tuple[Notice, ...]
    path: str  # the worker it ran on (`pool.cells.Ran`)
    start: str  # how it started: prepared, warm, cold or restored
    source: str  # where that worker came from
    closure: ClosureSummary
    timings: dict[str, float]
    payload: tuple[Wire, ...]  # for the kernel's execute reply (pager, next input)
    unneeded: tuple[str, ...]
    host: str | None = None  # a cluster's host it ran on
    placement: Placement | None = None  # why there


@dataclass(frozen=True)
class Followed(Reply):
    """`follow`'s reply: the followed cell's own (`cell`), or none when there was nothing to
    follow. On the wire, the cell's reply with ``followed`` added."""

    followed: bool
    cell: Executed | None = None

    @classmethod
    def from_wire(cls, raw: object) -> Self:
        if not is_map(raw) or not isinstance(raw.get("followed"), bool):
            raise ProtocolError("a follow's reply needs a boolean 'followed'")
        return cls(raw["followed"], Executed.from_wire(raw) if raw["followed"] else None)

    def to_map(self) -> Wire:
        return {**(self.cell.to_map() if self.cell is not None else {}),
                "followed": self.followed}


@dataclass(frozen=True)
class Interrupted(Reply):
    interrupted: bool  # whether a cell ran


@dataclass(frozen=True)
class Stopped(Reply):
    stopped: bool  # whether a cell ran
    version: int | None = None  # the session's, once it is over


@dataclass(frozen=True)
class InputAnswered(Reply):
    answered: bool


@dataclass(frozen=True)
class CheckedOut(Reply):
    """`checkout`'s reply: the new version, holding `checked_out`'s state."""

    version: int
    checked_out: int
    execution_count: int
    env: str | None  # the environment that version ran in
    packages_differ: Wire  # its packages that differ from the session's now (`envs`)


@dataclass(frozen=True)
class Closed(Reply):
    closed: bool
    version: int
    lease_seconds: float  # slot-seconds its cells leased here


@dataclass(frozen=True)
class Emigrated(Closed):
    image: Wire | None  # the pinned worker's carried image (`pool.migration.Carried`)


@dataclass(frozen=True)
class GivenUp(Reply):
    given_up: tuple[tuple[str, str], ...]  # (user, session) of each session closed


@dataclass(frozen=True)
class Immigrated(Reply):
    arrived: bool
    why: str | None = None  # why not
    bytes: int | None = None  # of the image restored


@dataclass(frozen=True)
class Tagged(Reply):
    version: int
    name: str


@dataclass(frozen=True)
class Removed(Reply):
    removed: bool


@dataclass(frozen=True)
class Completion(Reply):
    """A Jupyter `complete_reply`'s content."""

    status: str
    matches: tuple[str, ...]
    cursor_start: int
    cursor_end: int
    metadata: Wire


@dataclass(frozen=True)
class Inspection(Reply):
    """A Jupyter `inspect_reply`'s content."""

    status: str
    found: bool
    data: Wire
    metadata: Wire


@dataclass(frozen=True)
class Delivered(Reply):
    delivered: bool  # whether a comm of the live worker took the message


@dataclass(frozen=True)
class Debugged(Reply):
    content: Wire  # the `debug_reply`'s


@dataclass(frozen=True)
class CellHistory(Reply):
    cells: tuple[tuple[int, str], ...]  # (execution_count, source), oldest first


@dataclass(frozen=True)
class VersionHistory(Reply):
    versions: tuple[Wire, ...]  # newest first, as `snapshot.history.describe` describes them


@dataclass(frozen=True)
class Held(Reply):
    bytes: int  # of the session's state on this host's disk
    memory: int  # in a worker it keeps for the session


@dataclass(frozen=True)
class Moved(Record):
    session: str
    to: str


@dataclass(frozen=True)
class Drained(Reply):
    host: str
    moved: tuple[Moved, ...]


@dataclass(frozen=True)
class Pong(Reply):
    """`ping`'s reply. To the user who runs the host (a cluster's front door), also where it
    wakes workers carried to it and whether it is short of memory, then with the memory each
    session's worker holds, as (user, session, bytes)."""

    pong: bool
    pid: int
    user: str
    wake_dir: str | None = None
    pressure: bool | None = None
    holding: tuple[tuple[str, str, int], ...] | None = None


@dataclass(frozen=True)
class Error(Message):
    """A request's final answer when it failed: a `FabricError`'s wire map."""

    error: Wire

    def to_wire(self, msg_id: str | None) -> Wire:
        return {"type": "error", "msg_id": msg_id, "error": self.error}

    @classmethod
    def from_wire(cls, message: Wire) -> Error:
        return cls._build(message, "an error frame", cls.wire_types())


@dataclass(frozen=True)
class Heartbeat(Message):
    """The server's probe of a client whose cell runs; no msg_id, answers nothing."""

    def to_wire(self) -> Wire:
        return {"type": "heartbeat"}


def from_server(message: Wire, answer: type[Reply]) -> Event | Reply:
    """What the server sent for a request whose reply is an `answer`, checked; an error frame
    raises its RemoteError."""
    kind = message.get("type")
    if kind == "event":
        return Event.from_wire(message)
    if kind == "reply":
        return answer.from_wire(message)
    if kind == "error":
        raise RemoteError(Error.from_wire(message).error)
    raise ProtocolError(f"unknown frame type {kind!r}")

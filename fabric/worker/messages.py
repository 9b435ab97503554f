"""The server <-> worker wire: every message either end sends, defined once.

One msgpack map per ZeroMQ PAIR frame (`fabric.protocol`), tagged by `op`. Both ends build
messages as these dataclasses and read them back with `decode`, which checks every field's type:
a message that is malformed, or whose `op` is unknown, raises `ProtocolError` and is never
dropped or half-read.

A cell, as the server drives it: on a host serving several users, a fresh worker's `Become` first;
`Load` (0..n, each answered by `Loaded`, with `WorkerNotice`s of a long load's progress before it),
then `RunCell`, answered by `Started`, `CellOutput`s, `WorkerNotice`s, `AskInput`s (each
answered by an `InputReply`), `Saving` and finally `Done`. A replay runs its cells as
`RunCell(replay=True)` and ends with `Settle` -> `Settled`. `Park` -> `Parked` moves a kept
worker's torch storages off the GPU before its CUDA checkpoint, `Unpark` -> `Parked` back after its
restore. `Sleep` -> `Sleeping` takes a worker to a dump (cool tier); on waking it says `Hello`
again, as it does when it first connects.
A cell's comms send `CommOut`s among its outputs. `CompleteCode`, `InspectName` and `CommIn`,
between cells, are answered by `Answered` (a `CommIn` after its callbacks' `CellOutput`s and
`CommOut`s). `DebugCells` -> `DebugPort`, before a cell, opens the worker to a debugger
(`worker.debugging`). `Exit` ends it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .. import typed
from ..errors import ProtocolError
from ..protocol import Wire
from ..snapshot.commit import Report
from .account import Account

Groups = list[tuple[str, list[str]]]  # [blob, names] of each group to load
# [blob, names, reads] of each group to load once the cell makes one of those reads
Lazy = list[tuple[str, list[str], list[str]]]


class WorkerMessage:
    """A message of this wire: `op` names it; its fields are its dataclass fields."""

    op: ClassVar[str]

    def to_wire(self) -> Wire:
        return {"op": self.op, **_plain(self)}

    @classmethod
    def from_wire(cls, wire: dict) -> WorkerMessage:
        """The message `wire` holds, every field checked; ProtocolError names what is wrong."""
        try:
            return cls(**typed.record(cls, wire, cls.op))
        except typed.Mismatch as exc:
            raise ProtocolError(f"worker message field {exc}") from None


def _plain(record: Any) -> dict:
    """A dataclass's fields as a map (nested ones too), without copying their values."""
    return {f.name: _plain(value) if dataclasses.is_dataclass(value := getattr(record, f.name))
            else value for f in dataclasses.fields(record)}


# server -> worker

@dataclass(frozen=True)
class Load(WorkerMessage):
    """Load groups and imports; the first load of a worker also sets its directory and ambient
    state (`cwd`, `ambient`: the blob of the session's ambient state). `device`: the leased GPUs
    (as `RunCell`'s), for a load under a lease, where unpickling may initialize CUDA. `lazy`: groups
    the next cell loads only if it enters a branch that needs them (`worker.lazy`)."""

    op: ClassVar[str] = "load"
    groups: Groups = field(default_factory=list)
    imports: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    ambient: str | None = None
    device: str | None = None
    lazy: Lazy = field(default_factory=list)
    track_writes: bool = True  # the load's buffers are tracked for the saves (`snapshot.delta`)


@dataclass(frozen=True)
class Become(WorkerMessage):
    """Run as the session's user from now on (on a host serving several users): a fresh
    worker's first message, before anything of the session is loaded or run. Answered by
    `Loaded` (with the error, if the worker could not)."""

    op: ClassVar[str] = "become"
    account: Account


@dataclass(frozen=True)
class Rehome(WorkerMessage):
    """The worker was restored on another host (carried there as a dump): it reads and writes
    that host's `store` from now on, and its cells run in `cwd`, the session's directory there.
    Answered by `Loaded`, whose error says that directory is not there."""

    op: ClassVar[str] = "rehome"
    store: str
    cwd: str | None = None


@dataclass(frozen=True)
class RunCell(WorkerMessage):
    """Run a cell on the leased `device` (its GPUs' UUIDs, comma-joined, as
    CUDA_VISIBLE_DEVICES takes them) with `threads` intra-op threads; its
    save keeps the groups the cell cannot have `reached`. A `replay` runs a cell of a lineage
    again and saves nothing."""

    op: ClassVar[str] = "run"
    source: str
    execution_count: int = 1
    device: str | None = None
    threads: int = 0
    replay: bool = False
    reached: list[str] | None = None  # the names the cell reads or writes; None: any
    save_limit: float = 0.0  # seconds one group's pickling may take; 0: no limit
    track_writes: bool = True  # its save learns what changed without hashing it all (`delta`)
    parent_id: str | None = None  # the frontend's request, as the shell's parent (`shell`)


@dataclass(frozen=True)
class Settle(WorkerMessage):
    """After a replay, make the worker's state the head's but for `keep` (see
    `Worker.settle`); `want`: names that must be there afterwards."""

    op: ClassVar[str] = "settle"
    groups: Groups
    imports: dict[str, str]
    ambient: str | None
    keep: list[str]
    want: list[str]


@dataclass(frozen=True)
class InputReply(WorkerMessage):
    """The answer to an `AskInput`: the user's `value`, or why there is none."""

    op: ClassVar[str] = "input_reply"
    value: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class CompleteCode(WorkerMessage):
    """Between cells: the completions at `cursor` in `code`, answered by `Answered`."""

    op: ClassVar[str] = "complete"
    code: str
    cursor: int


@dataclass(frozen=True)
class InspectName(WorkerMessage):
    """Between cells: what the name at `cursor` in `code` is (`detail` 1: its source too)."""

    op: ClassVar[str] = "inspect"
    code: str
    cursor: int
    detail: int = 0


@dataclass(frozen=True)
class CommIn(WorkerMessage):
    """Between cells: a frontend's `comm_msg` or `comm_close` to a comm of the worker, handled
    by its callbacks (whose outputs and comm messages come first), answered by `Answered`."""

    op: ClassVar[str] = "comm_in"
    msg_type: str
    content: dict[str, Any]
    buffers: list[bytes] = field(default_factory=list)
    parent_id: str | None = None  # the frontend's request, as the shell's parent (`shell`)


@dataclass(frozen=True)
class Sleep(WorkerMessage):
    """Sleep through a dump; on waking, connect in `wake_dir` (the directory of the server
    that restores it, when that is another host's), else where it connected before."""

    op: ClassVar[str] = "sleep"
    wake_dir: str | None = None


@dataclass(frozen=True)
class Park(WorkerMessage):
    """Between cells, before the driver checkpoints the worker: move its torch storages off the
    GPU into pinned host memory (`worker.parking`). Answered by `Parked`."""

    op: ClassVar[str] = "park"


@dataclass(frozen=True)
class Unpark(WorkerMessage):
    """After the driver restored the worker: put back on the GPU what `Park` moved. Answered by
    `Parked`."""

    op: ClassVar[str] = "unpark"


@dataclass(frozen=True)
class DebugCells(WorkerMessage):
    """Before a cell, while the session's frontend debugs: serve the debug adapter protocol
    (debugpy, started once per worker) on a local port, for the server to connect to; with
    `trace` false, once it no longer debugs: run cells untraced. Answered by `DebugPort`."""

    op: ClassVar[str] = "debug"
    trace: bool = True


@dataclass(frozen=True)
class Exit(WorkerMessage):
    op: ClassVar[str] = "exit"


# worker -> server

@dataclass(frozen=True)
class Hello(WorkerMessage):
    op: ClassVar[str] = "hello"
    pid: int


@dataclass(frozen=True)
class Loaded(WorkerMessage):
    op: ClassVar[str] = "loaded"
    seconds: float = 0.0
    error: str | None = None
    traceback: str = ""


@dataclass(frozen=True)
class Answered(WorkerMessage):
    """A `CompleteCode` or `InspectName` answered: the content of Jupyter's reply to it."""

    op: ClassVar[str] = "answered"
    content: dict[str, Any]


@dataclass(frozen=True)
class Started(WorkerMessage):
    """The cell's code begins. It carries no time: a worker restored by CRIU runs in a time
    namespace of its own, whose monotonic clock is not the server's."""

    op: ClassVar[str] = "started"


@dataclass(frozen=True)
class Saving(WorkerMessage):
    """The cell's code is over; its state saves (an interrupt stops the save: what is not
    written yet stays unsaved, held by the worker)."""

    op: ClassVar[str] = "saving"


@dataclass(frozen=True)
class Flushing(WorkerMessage):
    """The cell's state is captured (pickled, hashed, described): only writing it to disk
    remains, which takes no execution slot, and the cell's user code is over."""

    op: ClassVar[str] = "flushing"


@dataclass(frozen=True)
class CellOutput(WorkerMessage):
    """An nbformat output (or clear_output, update_display_data) of the running cell."""

    op: ClassVar[str] = "output"
    output: dict[str, Any]


@dataclass(frozen=True)
class WorkerNotice(WorkerMessage):
    """What llfabric did, apart from the cell's outputs (`fabric.notices`)."""

    op: ClassVar[str] = "notice"
    topic: str
    text: str


@dataclass(frozen=True)
class CommOut(WorkerMessage):
    """A comm message of the running cell (`comm_open`, `comm_msg`, `comm_close`), as a kernel
    would publish it: its `content`, `metadata` and binary `buffers`."""

    op: ClassVar[str] = "comm"
    msg_type: str
    content: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    buffers: list[bytes] = field(default_factory=list)

    def event(self) -> dict[str, Any]:
        """The fields of the client wire's `Comm` event."""
        return {"msg_type": self.msg_type, "content": self.content, "metadata": self.metadata,
                "buffers": self.buffers}


@dataclass(frozen=True)
class AskInput(WorkerMessage):
    """The running cell called input() or getpass(): the `prompt` its user answers."""

    op: ClassVar[str] = "input"
    prompt: str
    password: bool = False


@dataclass(frozen=True)
class Done(WorkerMessage):
    """The cell ended (`status` ok or error, `ename`); `saved`, unless it was a replay or its
    save `failed` (a FabricError's wire form: a full disk). `lazy`: seconds it spent loading
    groups a branch needed; `unneeded`: the names of those it never needed, never loaded."""

    op: ClassVar[str] = "done"
    status: str
    ename: str | None = None
    run: float = 0.0
    save: float = 0.0
    saved: Report | None = None
    failed: dict[str, Any] | None = None
    payload: list[dict[str, Any]] = field(default_factory=list)  # the execute reply's
    lazy: float = 0.0
    unneeded: list[str] = field(default_factory=list)
    # what it imported on first use since its last cell, for its zygote to hold (`imports`)
    first_use: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Settled(WorkerMessage):
    op: ClassVar[str] = "settled"
    diverged: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    error: str | None = None
    traceback: str = ""


@dataclass(frozen=True)
class Parked(WorkerMessage):
    """What a `Park` moved into host memory (`moved` bytes; what torch still holds on the device,
    `left`, goes through the driver's checkpoint) or why it moved nothing (`fallback`: the driver
    takes the whole process); after an `Unpark`, all zero. `error`: the move failed."""

    op: ClassVar[str] = "parked"
    moved: int = 0
    left: int = 0
    seconds: float = 0.0
    fallback: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class DebugPort(WorkerMessage):
    """The port on 127.0.0.1 where the worker's debug adapter takes a client, or why it has
    none (`error`)."""

    op: ClassVar[str] = "debugging"
    port: int = 0
    error: str | None = None


@dataclass(frozen=True)
class Sleeping(WorkerMessage):
    op: ClassVar[str] = "sleeping"
    pid: int


@dataclass(frozen=True)
class Refused(WorkerMessage):
    """The worker could not read a message (malformed, or of an op it does not take)."""

    op: ClassVar[str] = "error"
    message: str


@dataclass(frozen=True)
class Failed(WorkerMessage):
    """The worker's last words: what ended it (a traceback), sent as it exits, since its
    stderr is its cells' and the server would otherwise see only an exit status."""

    op: ClassVar[str] = "failed"
    traceback: str


TO_WORKER = {m.op: m for m in (Become, Rehome, Load, RunCell, Settle, InputReply, CompleteCode,
                               InspectName, CommIn, Park, Unpark, Sleep, DebugCells, Exit)}
FROM_WORKER = {m.op: m for m in (Hello, Loaded, Answered, Started, Saving, Flushing, CellOutput,
                                 CommOut, WorkerNotice, AskInput, Done, Settled, Parked,
                                 DebugPort, Sleeping, Refused, Failed)}


def decode(wire: dict, ops: Mapping[str, type[WorkerMessage]]) -> WorkerMessage:
    """The message of `ops` (TO_WORKER or FROM_WORKER) that `wire` holds."""
    op = wire.get("op")
    kind = ops.get(op) if isinstance(op, str) else None
    if kind is None:
        raise ProtocolError(f"unknown worker message {wire.get('op')!r}")
    return kind.from_wire(wire)

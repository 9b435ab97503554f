"""The server's `status` reply and a session's status (the `open` reply, and in `status`),
typed as every reply is (`messages.Record`); and the reply of each op (`REPLIES`).

The wire keeps its plain msgpack maps, which other clients read as they are; a client that
prints or decides from them reads these classes instead, built by `from_wire`.
"""

from __future__ import annotations

import dataclasses
from typing import Self

from . import messages
from .messages import Notice, Placement, Record, Reply
from .protocol import Wire


@dataclasses.dataclass(frozen=True)
class SessionStatus(Reply):
    """One open session: its version, where its worker is (`tier`) and what it cost; the reply
    to `open`."""

    session: str
    version: int
    head: str | None
    execution_count: int
    opened: float  # epoch seconds
    variables: int
    bytes: int  # of the state it stores
    running: bool
    pinned: bool  # a worker kept alive for values that cannot be saved
    worker: int | None
    prepared: bool
    tier: str  # hot, warm, cool or cold
    # bytes that tier holds: its worker's processes' PSS (pages shared with a zygote or other
    # workers count a share each), or its cool image's size on disk
    memory: int
    lease_seconds: float  # slot-seconds: a lease of K slots counts K times
    notices: tuple[Notice, ...] = ()
    gpus: int = 1  # slots (GPUs) its cells lease together
    env: str | None = None  # the user's environment its cells import from; None: the server's
    # seconds since the client of its running cell went away, while no client follows the cell
    # (it runs on for the server's detached_grace); None: followed, or no cell runs
    detached: float | None = None
    host: str | None = None  # the cluster's host it is open on; None: a single host's
    # how its latest cell started: prepared, warm, cold or restored; None: none ran yet
    started: str | None = None
    placement: Placement | None = None  # why a cluster's front door opened it on `host`

    @property
    def flags(self) -> tuple[str, ...]:
        names = tuple(name for name in ("running", "pinned", "prepared") if getattr(self, name))
        return names + (("detached",) if self.detached is not None else ())


@dataclasses.dataclass(frozen=True)
class SlotStatus(Record):
    """One execution slot: on GPU hosts a device and its use now; the session holding it."""

    slot: int
    uuid: str | None = None
    name: str | None = None
    memory_used: int = 0
    memory_total: int = 0
    utilization: int = 0
    error: str | None = None  # NVML's, when it could not read the device
    session: str | None = None
    held: float | None = None  # seconds
    with_slots: tuple[int, ...] = ()  # every slot of the lease holding this one
    lingering: bool = False  # its cell ended; its worker keeps it for the session's next
    host: str | None = None  # a cluster's host it is on


@dataclasses.dataclass(frozen=True)
class WaiterStatus(Record):
    session: str
    waiting: float  # seconds
    slots: int = 1  # asked for together
    host: str | None = None  # a cluster's host it waits on


@dataclasses.dataclass(frozen=True)
class LeaseStatus(Record):
    """The host's slots: who holds them and who waits."""

    kind: str  # gpu or cpu
    slots: int
    threads: int
    held: int  # slots
    queued: int
    leases: tuple[SlotStatus, ...]
    queue: tuple[WaiterStatus, ...]


@dataclasses.dataclass(frozen=True)
class ZygoteStatus(Record):
    pid: int
    modules: tuple[str, ...]
    ready: bool
    memory: int  # bytes only it holds
    env: str = ""  # the site-packages of the environment it entered; "": the server's
    preloaded: tuple[str, ...] = ()  # what it imported besides its family: its workers' first uses


@dataclasses.dataclass(frozen=True)
class WorkerStatus(Record):
    pid: int
    source: str
    zygote: int | None
    parked: bool = False  # its CUDA state is off the GPU
    moved: int = 0  # bytes of it the worker moved into host memory itself (torch's storages)
    fallback: str | None = None  # why it moved none: the driver's checkpoint took it all


@dataclasses.dataclass(frozen=True)
class TemplateStatus(Record):
    modules: tuple[str, ...]
    state: str  # building, ready or failed
    error: str
    bytes: int
    built_in: float
    restores: int
    failed_imports: dict[str, str]
    env: str = ""  # the site-packages of the environment it imports; "": the server's


@dataclasses.dataclass(frozen=True)
class UpkeepStatus(Record):
    """The latest retention and gc pass."""

    time: float
    seconds: float
    thinned: int
    removed: int
    freed: int
    kept_bytes: int
    disk_percent: float
    pressure: bool  # the store's disk was past `disk_pressure`


@dataclasses.dataclass(frozen=True)
class EvictedStatus(Record):
    """Kept workers made to leave before their idle time: why, how, how many."""

    why: str  # memory_pressure, kept_memory or user_memory
    how: str  # retired, or cooled (dumped to disk: it held values the store cannot keep)
    count: int


@dataclasses.dataclass(frozen=True)
class MemoryStatus(Record):
    """Host memory as the server reads it, what its kept workers hold and its limits."""

    pressure: bool  # memory is short now: kept workers leave, least worth first
    used_percent: float  # of the host's memory, or of its cgroup's limit
    stall_percent: float | None  # of the last 10 s some task stalled on memory (PSI); None: none
    source: str  # host, or cgroup PATH
    kept: int  # bytes (PSS) the kept workers hold
    kept_memory: int  # its limit; 0: none
    user_memory: int  # one user's workers' limit; 0: none
    evicted: tuple[EvictedStatus, ...] = ()


@dataclasses.dataclass(frozen=True)
class BacklogStatus(Record):
    """What a remote filled behind the commits still lacks (`fabric.snapshot.behind`)."""

    remote: str
    sessions: int  # sessions whose head it lacks
    versions: int  # versions it lacks, over them all
    sent_bytes: int  # bytes sent to it since the host started
    failing: str  # why the last pass failed; "" if it did not
    retry_in: float  # seconds to the next try after a failed pass


@dataclasses.dataclass(frozen=True)
class HostStatus(Record):
    """One host of a cluster, as its front door sees it."""

    name: str
    node: str
    address: str
    slots: int
    running: int  # cells the door carries to it now
    sessions: int  # sessions open on it
    alive: bool
    draining: bool
    metrics: str = ""  # HOST:PORT where Prometheus scrapes its server
    # bytes of state it fetched, by the tier they came from (peer, remote)
    sourced: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ServerStatus(Reply):
    """The server as one user may see it: their sessions; others' only as busy slots."""

    pid: int
    uptime: float
    address: str
    store: str
    user: str
    leases: LeaseStatus
    zygotes: tuple[ZygoteStatus, ...]
    workers: tuple[WorkerStatus, ...]
    worker_source: str
    templates: tuple[TemplateStatus, ...]
    sessions: tuple[SessionStatus, ...]
    upkeep: UpkeepStatus | None = None  # None before the first pass
    hosts: tuple[HostStatus, ...] = ()  # a cluster's front door: its hosts
    # bytes of state this host fetched, by the tier they came from (peer, remote)
    sourced: dict[str, int] = dataclasses.field(default_factory=dict)
    memory: MemoryStatus | None = None  # a host's; None: a cluster's front door
    backlog: BacklogStatus | None = None  # a remote filled behind the commits; None: none

    @classmethod
    def from_wire(cls, raw: object) -> Self:
        if isinstance(raw, dict) and raw.get("upkeep") == {}:  # the wire's "no pass yet"
            raw = {k: v for k, v in raw.items() if k != "upkeep"}
        return super().from_wire(raw)

    def to_map(self) -> Wire:
        return {**super().to_map(), "upkeep": {} if self.upkeep is None else self.upkeep.to_map()}

    def session(self, name: str) -> SessionStatus | None:
        return next((s for s in self.sessions if s.session == name), None)


# The reply of each op: what a client reads its final frame as.
REPLIES: dict[str, type[Reply]] = {cls.op: reply for cls, reply in (
    (messages.Open, SessionStatus), (messages.Draft, messages.ClosureSummary),
    (messages.Execute, messages.Executed), (messages.Follow, messages.Followed),
    (messages.Interrupt, messages.Interrupted), (messages.Stop, messages.Stopped),
    (messages.Answer, messages.InputAnswered), (messages.Checkout, messages.CheckedOut),
    (messages.Close, messages.Closed), (messages.Tag, messages.Tagged),
    (messages.Remove, messages.Removed), (messages.Complete, messages.Completion),
    (messages.Inspect, messages.Inspection), (messages.CommMessage, messages.Delivered),
    (messages.Debug, messages.Debugged), (messages.History, messages.CellHistory),
    (messages.Versions, messages.VersionHistory), (messages.Status, ServerStatus),
    (messages.Holds, messages.Held), (messages.Drain, messages.Drained),
    (messages.Emigrate, messages.Emigrated), (messages.Immigrate, messages.Immigrated),
    (messages.Ping, messages.Pong), (messages.GiveUp, messages.GivenUp))}

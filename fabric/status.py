"""The server's `status` reply and a session's status (in `status` and `open` replies), typed.

The wire keeps its plain msgpack maps, which other clients read as they are; a client that
prints or decides from them reads these classes instead, built by `from_wire`. It checks every
field it knows against its declared type (a float accepts an int, a tuple a list) and ignores
keys it does not know, so a newer server that adds a key does not break an older client, and a
reply that lacks a key or has one of the wrong type is a `ProtocolError`, not a KeyError deep in
a printer.
"""

from __future__ import annotations

import dataclasses
from typing import Self

from . import typed
from .errors import ProtocolError


class _Wire:
    """`from_wire` for a dataclass of the wire's scalars, tuples, dicts and other `_Wire`s."""

    @classmethod
    def from_wire(cls, raw: object) -> Self:
        if not isinstance(raw, dict):
            raise ProtocolError(f"{cls.__name__} must be a map, not {type(raw).__name__}")
        try:
            return cls(**typed.record(cls, raw, cls.__name__))
        except typed.Mismatch as exc:
            owner, _, key = exc.where.rpartition(".")
            if exc.missing:
                raise ProtocolError(f"{owner} lacks {key!r}", key=key) from None
            raise ProtocolError(f"status field {exc.where} should be {exc.expected}, "
                                f"not {exc.value!r}"[:300], field=exc.where) from None


@dataclasses.dataclass(frozen=True)
class Notice(_Wire):
    """What llfabric said about itself during a cell (`fabric.notices`)."""

    topic: str
    text: str
    time: float


@dataclasses.dataclass(frozen=True)
class SessionStatus(_Wire):
    """One open session: its version, where its worker is (`tier`) and what it cost."""

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
    memory: int  # bytes that tier holds
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

    @property
    def flags(self) -> tuple[str, ...]:
        names = tuple(name for name in ("running", "pinned", "prepared") if getattr(self, name))
        return names + (("detached",) if self.detached is not None else ())


@dataclasses.dataclass(frozen=True)
class SlotStatus(_Wire):
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


@dataclasses.dataclass(frozen=True)
class WaiterStatus(_Wire):
    session: str
    waiting: float  # seconds
    slots: int = 1  # asked for together


@dataclasses.dataclass(frozen=True)
class LeaseStatus(_Wire):
    """The host's slots: who holds them and who waits."""

    kind: str  # gpu or cpu
    slots: int
    threads: int
    held: int  # slots
    queued: int
    leases: tuple[SlotStatus, ...]
    queue: tuple[WaiterStatus, ...]


@dataclasses.dataclass(frozen=True)
class ZygoteStatus(_Wire):
    pid: int
    modules: tuple[str, ...]
    ready: bool
    memory: int  # bytes only it holds
    env: str = ""  # the site-packages of the environment it entered; "": the server's


@dataclasses.dataclass(frozen=True)
class WorkerStatus(_Wire):
    pid: int
    source: str
    zygote: int | None
    parked: bool = False  # its CUDA state is off the GPU
    moved: int = 0  # bytes of it the worker moved into host memory itself (torch's storages)
    fallback: str | None = None  # why it moved none: the driver's checkpoint took it all


@dataclasses.dataclass(frozen=True)
class TemplateStatus(_Wire):
    modules: tuple[str, ...]
    state: str  # building, ready or failed
    error: str
    bytes: int
    built_in: float
    restores: int
    failed_imports: dict[str, str]


@dataclasses.dataclass(frozen=True)
class UpkeepStatus(_Wire):
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
class HostStatus(_Wire):
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
class ServerStatus(_Wire):
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

    @classmethod
    def from_wire(cls, raw: object) -> Self:
        if isinstance(raw, dict) and raw.get("upkeep") == {}:  # the wire's "no pass yet"
            raw = {k: v for k, v in raw.items() if k != "upkeep"}
        return super().from_wire(raw)

    def session(self, name: str) -> SessionStatus | None:
        return next((s for s in self.sessions if s.session == name), None)

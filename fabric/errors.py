"""Exceptions, named for whose fault they are.

Every error that crosses the wire is a `FabricError` with a machine-readable `kind`; the message is
built from structured fields so the client can show it without parsing text. Each kind is one
class here, and clients match on kinds (`RemoteError` carries the server's), so a kind once sent
keeps its name. Only `RemoteError` has no kind of its own.
"""

from __future__ import annotations


class FabricError(Exception):
    """Base class of every error llfabric raises on purpose."""

    kind = "fabric"

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def to_wire(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, **self.fields}


class ProtocolError(FabricError):
    """The peer sent something that is not a valid message (its fault)."""

    kind = "protocol"


class ZygoteProtocolError(ProtocolError):
    """A packet on a zygote's control channel that is not one of its messages for that end (an
    unknown op, a missing or mistyped field), or a zygote's refusal of a request it could not
    read; see `fabric.worker.control`."""

    kind = "zygote_protocol"


class UnknownSession(FabricError):
    """No session of that name is open (or in the store, for what works on stored ones)."""

    kind = "unknown_session"


class SessionBusy(FabricError):
    """The session already runs a cell; cells of one session run one at a time."""

    kind = "busy"


class StoreError(FabricError):
    """The store refused to read or write: missing, corrupt or unsigned data."""

    kind = "store"


class StaleHead(StoreError):
    """A commit built on a version that is no longer the session's head; nothing was written
    over the head that moved meanwhile."""

    kind = "stale"


class InUse(FabricError):
    """A store or an address is held by another running server."""

    kind = "in_use"


class WorkerDied(FabricError):
    """A worker process exited while it held a cell (killed, crashed, out of memory)."""

    kind = "worker_died"


class CellStopped(FabricError):
    """The server stopped a running cell (interrupt grace over, close, client gone); the
    session stays at its last commit."""

    kind = "stopped"


class Detached(FabricError):
    """A client let go of its running cell (a second Ctrl-C): the cell runs on, on the server."""

    kind = "detached"


class NotebookError(FabricError):
    """A notebook file that is not valid nbformat."""

    kind = "notebook"


class Unreachable(FabricError):
    """No server answered at the address (the outside failed)."""

    kind = "unreachable"


class RemoteError(FabricError):
    """An error that came over a wire (a server's reply, a worker's report), raised here."""

    def __init__(self, wire: dict) -> None:
        fields = {k: v for k, v in wire.items() if k not in ("message", "kind")}
        super().__init__(str(wire.get("message", "error")), **fields)
        self.kind = str(wire.get("kind", "fabric"))


class FrameTooLarge(ProtocolError):
    """A frame over the size the server accepts."""

    kind = "frame_too_large"


class DiskFull(StoreError):
    """The store's disk (or quota) is full; the save failed and nothing of it was committed."""

    kind = "disk_full"


class RemoteFailed(StoreError):
    """The remote tier refused a write or a read, or did not answer in time (`remote_timeout`):
    its message names the remote and the cause; a commit that needed it committed nothing."""

    kind = "remote_failed"


class RemoteFull(RemoteFailed):
    """The remote tier (or its quota) is full; a commit that needed it committed nothing."""

    kind = "remote_full"


class UnsafePath(FabricError):
    """A directory or file that another user could have made or could change."""

    kind = "unsafe_path"


class Forbidden(FabricError):
    """The client is not admitted, or asked for what is not its own."""

    kind = "forbidden"


class LimitReached(FabricError):
    """A per-user limit of the server's configuration (sessions, running cells)."""

    kind = "limit"


class LoadFailed(FabricError):
    """A worker could not load the session's state from the store."""

    kind = "load"


class ConfigError(FabricError):
    """A configuration file, key or value that cannot be used (the user's to fix); `key` names
    the setting where one is at fault."""

    kind = "config"


class InvalidName(FabricError):
    """A user, session or tag name outside what names may hold."""

    kind = "invalid_name"


class AlreadyExists(FabricError):
    """What a command would create exists already; nothing was overwritten."""

    kind = "exists"


class UnknownUser(FabricError):
    """No key of that user is admitted."""

    kind = "unknown_user"


class BadKey(FabricError):
    """A key file that is not one `llfabric keys new` (or the server's first start) wrote."""

    kind = "bad_key"


class KernelError(FabricError):
    """A Jupyter kernel that could not be found, did not answer, or refused to attach."""

    kind = "kernel"


class AuditFailed(FabricError):
    """The audit's own interpreter failed (not a cell of the notebook); `log` is its tail."""

    kind = "audit"


class CheckpointError(FabricError):
    """CRIU refused or failed a dump or restore; `log` holds the tail of CRIU's own log."""

    kind = "checkpoint"


class CudaError(FabricError):
    """The driver refused a checkpoint step; `error` is its own name for why."""

    kind = "cuda"


class NotReplayable(StoreError):
    """Lost values cannot be rebuilt safely from their cells; `message` says why."""

    kind = "not_replayable"


class ParkFailed(FabricError):
    """A worker could not be parked, cooled or resumed; the session falls back to the store."""

    kind = "park"


class NoZygote(FabricError):
    """No zygote can fork a worker now (it died, or none is ready); the pool starts a cold
    worker instead."""

    kind = "no_zygote"


class NotWaiting(FabricError):
    """An answer to an input request when no cell of the session waits for one."""

    kind = "not_waiting"


class AddressRefused(FabricError):
    """The server cannot serve on the address it was given (its scheme, or tcp without keys)."""

    kind = "address"


class SlotsUnavailable(FabricError):
    """A cell asked for more execution slots (GPUs) than the host has, or fewer than one: it
    could never run, so it is refused at once instead of waiting; `asked` and `slots` say how
    many."""

    kind = "slots"


class TraceError(FabricError):
    """A fleet input that cannot be read: a malformed trace row, or a run directory without the
    results a report needs (the file's fault; `path` and, for a row, `line` say where)."""

    kind = "trace"


class UnknownEnv(FabricError):
    """No environment of that name belongs to the user (`llfabric env list` shows theirs)."""

    kind = "unknown_env"


class EnvError(FabricError):
    """An environment could not be made or changed (its installer failed, say)."""

    kind = "env"


class HostLost(FabricError):
    """A cluster's host went away (its node removed, its agent dead) while it served the
    request; what the session committed before is kept, and its next cell runs elsewhere."""

    kind = "host_lost"


class UnknownHost(FabricError):
    """No host of that name is in the cluster."""

    kind = "unknown_host"

"""llfabric: notebook cells on warm workers, the GPU held only while a cell runs.

What users and `cli/` may rely on is named here; the modules behind it may change. Every
worker imports this package (as the parent of `fabric.worker`), so it stays light: the errors
cost nothing to import, everything else is imported on first use (`__getattr__`), and
`import fabric` alone pulls in neither ZeroMQ nor IPython nor numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    AddressRefused,
    AlreadyExists,
    AuditFailed,
    BadKey,
    CellStopped,
    CheckpointError,
    ConfigError,
    CudaError,
    Detached,
    DiskFull,
    EnvError,
    FabricError,
    Forbidden,
    FrameTooLarge,
    HostLost,
    InUse,
    InvalidName,
    KernelError,
    LimitReached,
    LoadFailed,
    NotebookError,
    NotReplayable,
    NotWaiting,
    NoZygote,
    ParkFailed,
    ProtocolError,
    RemoteError,
    RemoteFailed,
    RemoteFull,
    SessionBusy,
    SlotsUnavailable,
    StaleHead,
    StoreError,
    TraceError,
    UnknownEnv,
    UnknownHost,
    UnknownSession,
    UnknownUser,
    Unreachable,
    UnsafePath,
    WorkerDied,
    ZygoteProtocolError,
)

if TYPE_CHECKING:  # what `_LAZY` gives, as type checkers and editors should see it
    from .client import Client
    from .config import Config
    from .config import load as load_config
    from .embedded import EmbeddedServer
    from .snapshot import Manifest, Store
    from .status import ServerStatus, SessionStatus

# public name -> (module, attribute), imported when first asked for
_LAZY = {
    "Client": ("client", "Client"),
    "Config": ("config", "Config"),
    "load_config": ("config", "load"),
    "EmbeddedServer": ("embedded", "EmbeddedServer"),
    "Store": ("snapshot", "Store"),
    "Manifest": ("snapshot", "Manifest"),
    "ServerStatus": ("status", "ServerStatus"),
    "SessionStatus": ("status", "SessionStatus"),
}

__all__ = [
    "AddressRefused",
    "AlreadyExists",
    "AuditFailed",
    "BadKey",
    "CellStopped",
    "CheckpointError",
    "Client",
    "Config",
    "ConfigError",
    "CudaError",
    "Detached",
    "DiskFull",
    "EmbeddedServer",
    "EnvError",
    "FabricError",
    "Forbidden",
    "FrameTooLarge",
    "HostLost",
    "InUse",
    "InvalidName",
    "KernelError",
    "LimitReached",
    "LoadFailed",
    "Manifest",
    "NoZygote",
    "NotReplayable",
    "NotWaiting",
    "NotebookError",
    "ParkFailed",
    "ProtocolError",
    "RemoteError",
    "RemoteFailed",
    "RemoteFull",
    "ServerStatus",
    "SessionBusy",
    "SessionStatus",
    "SlotsUnavailable",
    "StaleHead",
    "Store",
    "StoreError",
    "TraceError",
    "UnknownEnv",
    "UnknownHost",
    "UnknownSession",
    "UnknownUser",
    "Unreachable",
    "UnsafePath",
    "WorkerDied",
    "ZygoteProtocolError",
    "load_config",
]


def __getattr__(name: str) -> object:
    """The lazily imported part of the public face, and `__version__` (the installed one)."""
    if name == "__version__":
        from importlib.metadata import version

        return version("llfabric")
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

"""The public face, `fabric/__init__.py`: what it names, and that importing it stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import fabric
from fabric import errors

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = [
    "AddressRefused", "AlreadyExists", "AuditFailed", "BadKey", "CellStopped", "CheckpointError",
    "Client",
    "Config", "ConfigError", "CudaError", "Detached", "DiskFull", "EmbeddedServer", "EnvError",
    "FabricError",
    "Forbidden", "FrameTooLarge", "HostLost", "InUse", "InvalidName", "KernelError", "LimitReached",
    "LoadFailed", "Manifest", "NoZygote", "NotReplayable", "NotWaiting", "NotebookError",
    "ParkFailed", "ProtocolError", "RemoteError", "RemoteFailed", "RemoteFull",
    "ServerStatus", "SessionBusy", "SessionStatus", "SlotsUnavailable", "StaleHead", "Store",
    "StoreError", "TraceError",
    "UnknownEnv", "UnknownHost", "UnknownSession", "UnknownUser", "Unreachable", "UnsafePath",
    "WorkerDied",
    "ZygoteProtocolError", "load_config",
]


def test_the_public_names_are_pinned() -> None:
    assert sorted(fabric.__all__) == sorted(PUBLIC)
    assert len(set(fabric.__all__)) == len(fabric.__all__)


def test_every_public_name_resolves_and_is_listed() -> None:
    for name in fabric.__all__:
        assert getattr(fabric, name) is not None, name
    assert set(fabric.__all__) <= set(dir(fabric))
    assert fabric.__version__ == version("llfabric")
    assert fabric.Client.__module__ == "fabric.client"


def test_every_error_is_public_and_each_kind_is_its_own() -> None:
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.FabricError)]
    assert {c.__name__ for c in classes} <= set(fabric.__all__)
    kinds = [c.kind for c in classes if c is not errors.RemoteError]
    assert len(kinds) == len(set(kinds)), kinds
    # the kinds clients and other servers already match on keep their names
    assert {"protocol", "unknown_session", "busy", "store", "stale", "in_use", "worker_died",
            "stopped", "unreachable", "frame_too_large", "disk_full", "forbidden",
            "limit"} <= set(kinds)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        fabric.NoSuchThing  # noqa: B018


def test_importing_fabric_alone_stays_light() -> None:
    """Every worker imports the package: ZeroMQ, IPython, numpy and the rest of fabric load only
    when something asks for them."""
    code = ("import sys, json; import fabric; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('fabric', 'zmq', 'IPython', 'numpy', 'torch', 'msgpack', 'click', 'psutil'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(ROOT)}).stdout
    assert json.loads(out) == ["fabric", "fabric.errors"]

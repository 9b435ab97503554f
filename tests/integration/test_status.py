"""The typed `status` replies: what a real server sends reads as them, what is wrong does not."""

from __future__ import annotations

import copy

import pytest
from helpers import execute

from fabric.errors import ProtocolError
from fabric.status import ServerStatus, SessionStatus, SlotStatus

SESSION = {"session": "s", "version": 2, "head": "ab" * 16, "execution_count": 2,
           "opened": 1700000000.5, "variables": 3, "bytes": 120, "running": False,
           "pinned": True, "worker": 4242, "prepared": True, "tier": "warm", "memory": 1 << 20,
           "lease_seconds": 1, "notices": [{"topic": "pinned", "text": "g cannot be saved",
                                            "time": 1700000001.0}]}
SERVER = {"type": "reply", "msg_id": "1-1", "pid": 10, "uptime": 3.5, "address": "ipc:///x",
          "store": "/s", "user": "me",
          "leases": {"kind": "gpu", "slots": 2, "threads": 4, "held": 1, "queued": 1,
                     "leases": [{"slot": 0, "uuid": "GPU-1", "name": "H200",
                                 "memory_used": 5, "memory_total": 10, "utilization": 7,
                                 "session": "s", "held": 0.5},
                                {"slot": 1, "error": "NVML: gone"}],
                     "queue": [{"session": "(another user's)", "waiting": 2}]},
          "zygotes": [{"pid": 11, "modules": ["numpy"], "ready": True, "memory": 9}],
          "workers": [{"pid": 12, "source": "zygote", "zygote": 11}],
          "worker_source": "zygote",
          "templates": [{"modules": [], "state": "failed", "error": "no criu", "bytes": 0,
                         "built_in": 0.0, "restores": 0, "failed_imports": {}}],
          "upkeep": {}, "sessions": [SESSION]}


def test_a_full_reply_reads_with_its_types() -> None:
    status = ServerStatus.from_wire(SERVER)
    assert status.upkeep is None  # no retention pass yet
    assert status.leases.leases[0] == SlotStatus(0, "GPU-1", "H200", 5, 10, 7, None, "s", 0.5)
    assert status.leases.leases[1].error == "NVML: gone" and status.leases.leases[1].uuid is None
    assert status.leases.queue[0].waiting == 2.0
    assert status.zygotes[0].modules == ("numpy",)
    mine = status.session("s")
    assert mine is not None and mine.lease_seconds == 1.0 and isinstance(mine.lease_seconds, float)
    assert mine.notices[0].text == "g cannot be saved"
    assert mine.flags == ("pinned", "prepared")
    assert status.session("other") is None


def test_keys_it_does_not_know_are_ignored() -> None:
    raw = copy.deepcopy(SERVER)
    raw["new_thing"] = {"x": 1}
    raw["sessions"][0]["gpu_memory"] = 7
    raw["leases"]["leases"][0]["temperature"] = 60
    assert ServerStatus.from_wire(raw) == ServerStatus.from_wire(SERVER)


@pytest.mark.parametrize("path, value, problem", [
    (("pid",), "10", "ServerStatus.pid should be int"),
    (("sessions", 0, "running"), 1, "SessionStatus.running should be bool"),
    (("sessions", 0, "version"), True, "SessionStatus.version should be int"),
    (("leases", "leases", 1, "slot"), None, "SlotStatus.slot should be int"),
    (("zygotes", 0, "modules"), "numpy", "ZygoteStatus.modules should be tuple"),
    (("sessions", 0, "notices", 0), "text", "Notice must be a map"),
    (("upkeep",), {"time": 1.0}, "UpkeepStatus lacks 'seconds'"),
])
def test_a_wrong_type_or_a_missing_key_is_a_protocol_error(path: tuple, value: object,
                                                           problem: str) -> None:
    raw = copy.deepcopy(SERVER)
    target = raw
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(ProtocolError) as err:
        ServerStatus.from_wire(raw)
    assert problem in err.value.message and err.value.kind == "protocol"


def test_a_missing_key_is_named() -> None:
    raw = {k: v for k, v in SESSION.items() if k != "tier"}
    with pytest.raises(ProtocolError, match="SessionStatus lacks 'tier'"):
        SessionStatus.from_wire(raw)


def test_a_real_servers_replies_read(server, client, session) -> None:
    """Keeps the classes and the server's status methods to one wire shape."""
    execute(client, session, "g = (i for i in range(3))")  # pinned, with a notice
    status = client.status()
    mine = status.session(session)
    assert mine is not None and mine.pinned and mine.tier == "warm" and mine.notices
    assert status.leases.kind == "cpu" and len(status.leases.leases) == status.leases.slots
    assert status.address == server.address
    opened = client.open(session)
    assert opened.session == session and opened.version == mine.version

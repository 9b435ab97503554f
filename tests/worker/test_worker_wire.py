"""The server <-> worker wire: every message survives its trip through msgpack, and what is not
one of the wire's messages, to the end that reads it, is refused by name."""

from __future__ import annotations

import msgpack
import pytest

from fabric.errors import ProtocolError
from fabric.snapshot.commit import Report
from fabric.worker.messages import (
    FROM_WORKER,
    TO_WORKER,
    Answered,
    AskInput,
    CellOutput,
    CommIn,
    CommOut,
    CompleteCode,
    DebugCells,
    DebugPort,
    Done,
    Exit,
    Failed,
    Flushing,
    Hello,
    InputReply,
    InspectName,
    Load,
    Loaded,
    Park,
    Parked,
    Refused,
    Rehome,
    RunCell,
    Saving,
    Settle,
    Settled,
    Sleep,
    Sleeping,
    Started,
    Unpark,
    WorkerNotice,
    decode,
)

REPORT = Report(groups=[("b" * 32, ["x", "y"], 12)], kept=["z"], imports={"np": "numpy"},
                refs={"f": ["x"]}, packages={"x": ["numpy"]}, ambient="a" * 32,
                owned=["x", "y", "z", "np"], unsaved={"g": "a generator"}, bounded=True)

SAMPLES = [
    Load([("b" * 32, ["x"])], {"np": "numpy"}, cwd="/tmp", ambient="a" * 32), Load(),
    RunCell("x = 1", 3, "GPU-1", 2, reached=["x"]), RunCell("y", replay=True),
    Settle([("b" * 32, ["x"])], {}, None, ["g"], ["x"]), InputReply(value="42"),
    InputReply(error="no"), CompleteCode("my_", 3), InspectName("x", 1, 1), Sleep(),
    Sleep("/run/llfabric-x"), Rehome("/srv/llfabric/store"), Park(), Unpark(), Exit(),
    CommIn("comm_msg", {"comm_id": "c", "data": {"method": "update"}}, [b"\x01"]),
    Answered({"status": "ok", "matches": ["my_var"]}),
    CommOut("comm_msg", {"comm_id": "c", "data": {"method": "update"}}, {}, [b"\x00"]),
    Hello(7), Loaded(0.5), Loaded(error="E: e", traceback="tb"), Started(), Saving(),
    CellOutput({"output_type": "stream", "name": "stdout", "text": "hi"}),
    WorkerNotice("ambient", "t"),
    AskInput("name? ", password=True), Done("ok", None, 2.0, 3.0, REPORT),
    Done("error", "KeyError", failed={"kind": "disk_full", "message": "full"}),
    Settled(diverged=["a"], dropped=["g"]), Sleeping(7), Refused("bad"), Failed("Traceback"),
    Flushing(),
    Parked(1 << 33, 1 << 20, 0.4), Parked(left=5, fallback="a CUDA graph"), Parked(error="E: e"),
    Done("ok", payload=[{"source": "page", "data": {"text/plain": "zip"}, "start": 0}]),
    DebugCells(), DebugCells(trace=False), DebugPort(45123),
    DebugPort(error="ModuleNotFoundError: debugpy"),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: m.op)
def test_every_message_survives_its_trip(message) -> None:
    ops = TO_WORKER if message.op in TO_WORKER else FROM_WORKER
    wire = msgpack.unpackb(msgpack.packb(message.to_wire(), use_bin_type=True), raw=False)
    assert decode(wire, ops) == message


@pytest.mark.parametrize(("wire", "ops", "why"), [
    ({"op": "done", "status": "ok"}, TO_WORKER, "unknown worker message 'done'"),
    ({"op": "run"}, FROM_WORKER, "unknown worker message 'run'"),
    ({"source": "x"}, TO_WORKER, "unknown worker message None"),
    ({"op": "run"}, TO_WORKER, r"run.source is missing"),
    ({"op": "run", "source": "x", "threads": True}, TO_WORKER, r"run.threads is True, not int"),
    ({"op": "load", "groups": [["b", "x"]]}, TO_WORKER, r"load.groups\[0\]\[1\] is 'x'"),
    ({"op": "hello", "pid": "7"}, FROM_WORKER, r"hello.pid is '7', not int"),
    ({"op": "complete", "code": "x", "cursor": "1"}, TO_WORKER, r"complete.cursor is '1'"),
    ({"op": "answered", "content": []}, FROM_WORKER, r"answered.content is \[\], not dict"),
    ({"op": "done", "status": "ok", "saved": {**REPORT.__dict__, "owned": "x"}}, FROM_WORKER,
     r"done.saved.owned is 'x'"),
    ({"op": "done", "status": "ok", "saved": {"groups": []}}, FROM_WORKER,
     r"done.saved.kept is missing"),
])
def test_what_is_not_a_message_of_the_wire_is_refused_by_name(wire: dict, ops: dict,
                                                                why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        decode(wire, ops)

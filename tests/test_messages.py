"""The client <-> server messages: each survives its trip, and what is not one is refused."""

from __future__ import annotations

import pytest

from fabric.errors import ProtocolError, RemoteError
from fabric.messages import (
    EVENTS,
    REQUESTS,
    Answer,
    Checkout,
    Close,
    Comm,
    CommMessage,
    Complete,
    Debug,
    DebugEvent,
    Draft,
    Drain,
    Emigrate,
    Error,
    Execute,
    Follow,
    GiveUp,
    History,
    Holds,
    Immigrate,
    InputRequest,
    Inspect,
    Interrupt,
    Leased,
    Notice,
    Open,
    Output,
    Ping,
    Queued,
    Remove,
    Reply,
    Request,
    Status,
    Stop,
    Tag,
    Tagged,
    Versions,
    from_server,
    request,
)
from fabric.protocol import pack, unpack
from fabric.status import REPLIES

EVERY_REQUEST = [
    Open("s"), Open("s", "/tmp"), Draft("s", "x = 1"), Execute("s", "x", stdin=True, cell_id="c"),
    Interrupt("s"), Answer("s", value="42"), Answer("s", error="no stdin"), Checkout("s", 3),
    Checkout("s", "best"), Close("s"), Tag("s", "best"), Tag("s", "best", 2), Remove("s"),
    Complete("s", "my_", 3), Inspect("s", "x", 1), Inspect("s", "x", 1, detail=1), History("s"),
    CommMessage("s", "comm_msg", {"comm_id": "c", "data": {}}, [b"\x00"]),
    Versions("s"), Follow("s"), Stop("s"), Status(), Ping(), Holds("s"), Holds("s", "x + 1"),
    Drain("host-a"), Drain("host-a", undo=True), Emigrate("s", "ann", "/run/llfabric-x"),
    Immigrate("s", "ann", {"files": [["pages-1.img", ["a" * 32]]], "init": False}), GiveUp(),
    Debug("s", {"type": "request", "seq": 1, "command": "stackTrace",
                "arguments": {"threadId": 1}}),
]
EVERY_EVENT = [
    Output({"output_type": "stream", "name": "stdout", "text": "hi\n"}), Queued(2, 1),
    Leased(0.5), InputRequest("? "), InputRequest("pw: ", password=True),
    Notice("pinned", "g cannot be saved", 1.0),
    Comm("comm_open", {"comm_id": "c", "target_name": "jupyter.widget", "data": {}}, {},
         [b"\x00\x01"]),
    DebugEvent({"type": "event", "seq": 3, "event": "stopped", "body": {"threadId": 1}}),
]


def test_every_op_has_a_request_and_every_request_is_tested() -> None:
    assert {type(r) for r in EVERY_REQUEST} == set(REQUESTS.values())
    assert {type(e) for e in EVERY_EVENT} == set(EVENTS.values())


@pytest.mark.parametrize("sent", EVERY_REQUEST, ids=repr)
def test_a_request_arrives_as_it_was_sent(sent: Request) -> None:
    wire = unpack(pack(sent.to_wire("m1")))
    assert wire["op"] == sent.op and wire["msg_id"] == "m1"
    assert Request.from_wire(wire) == sent


def test_an_unset_optional_field_stays_off_the_wire() -> None:
    assert Tag("s", "best").to_wire("m") == {"op": "tag", "msg_id": "m", "session": "s",
                                             "name": "best"}


def test_a_request_named_by_its_op_is_checked_before_it_is_sent() -> None:
    assert request("checkout", session="s", version=2) == Checkout("s", 2)
    with pytest.raises(ProtocolError, match="unknown op"):
        request("shutdown")
    with pytest.raises(ProtocolError, match="needs field 'source'"):
        request("draft", session="s")
    with pytest.raises(ProtocolError, match="'stdin' must be a boolean"):
        request("execute", session="s", source="1", stdin=1)


@pytest.mark.parametrize("sent", EVERY_EVENT, ids=repr)
def test_an_event_arrives_as_it_was_sent(sent) -> None:
    wire = unpack(pack(sent.to_wire("m1")))
    assert wire["type"] == "event" and wire["event"] == sent.event and wire["msg_id"] == "m1"
    assert from_server(wire, Reply) == sent


def test_a_reply_carries_its_fields() -> None:
    wire = unpack(pack(Tagged(3, "best").to_wire("m1")))
    assert wire == {"type": "reply", "msg_id": "m1", "version": 3, "name": "best"}
    assert from_server(wire, Tagged) == Tagged(3, "best")


def test_every_op_has_its_reply() -> None:
    assert set(REPLIES) == set(REQUESTS)


@pytest.mark.parametrize(("frame", "match"), [
    ({"type": "reply", "msg_id": "m", "version": 3}, "Tagged lacks 'name'"),
    ({"type": "reply", "msg_id": "m", "version": "3", "name": "best"}, "Tagged.version"),
])
def test_a_reply_not_of_its_ops_shape_is_refused(frame: dict, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        from_server(frame, Tagged)


def test_an_error_frame_raises_its_error() -> None:
    wire = Error({"kind": "busy", "message": "running", "session": "s"}).to_wire("m1")
    with pytest.raises(RemoteError) as err:
        from_server(unpack(pack(wire)), Reply)
    assert (err.value.kind, err.value.message, err.value.fields) == ("busy", "running",
                                                                      {"session": "s"})


@pytest.mark.parametrize(("frame", "match"), [
    ({"msg_id": "m"}, "unknown frame type"),
    ({"type": "result", "msg_id": "m"}, "unknown frame type"),
    ({"type": "event", "msg_id": "m", "event": "progress"}, "unknown event"),
    ({"type": "event", "msg_id": "m"}, "unknown event"),
    ({"type": "event", "msg_id": "m", "event": "queued", "ahead": 1}, "needs field 'slots'"),
    ({"type": "event", "msg_id": "m", "event": "leased", "waited": "1"}, "must be a number"),
    ({"type": "event", "msg_id": "m", "event": "queued", "ahead": True, "slots": 1},
     "must be an integer"),
    ({"type": "event", "msg_id": "m", "event": "output", "output": "text"}, "must be a map"),
    ({"type": "event", "msg_id": "m", "event": "output", "output": {"output_type": "x"}},
     "unknown type"),
    ({"type": "event", "msg_id": "m", "event": "input_request", "prompt": "?", "password": 1},
     "must be a boolean"),
    ({"type": "event", "msg_id": "m", "event": "comm", "msg_type": "shell", "content": {},
      "metadata": {}, "buffers": []}, "comm message of unknown type"),
    ({"type": "event", "msg_id": "m", "event": "comm", "msg_type": "comm_msg", "content": {},
      "metadata": {}, "buffers": ["text"]}, "must be"),
    ({"type": "error", "msg_id": "m", "error": "failed"}, "must be a map"),
    ({"type": "error", "msg_id": "m"}, "needs field .error."),
], ids=lambda v: v if isinstance(v, str) else "")
def test_what_is_not_a_server_message_is_refused(frame: dict, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        from_server(frame, Reply)


def test_fields_a_newer_server_adds_are_ignored() -> None:
    wire = {**Leased(0.5).to_wire("m"), "device": "cuda:0"}
    assert from_server(wire, Reply) == Leased(0.5)

"""Wire-format validation: frames and client requests."""

from __future__ import annotations

import msgpack
import pytest

from fabric.errors import ProtocolError
from fabric.messages import CLIENT_OPS, Request
from fabric.protocol import pack, peek_msg_id, unpack


def check_request(message: dict) -> dict:
    """The server's check of a request: `message`, accepted as it came, or ProtocolError."""
    Request.from_wire(message)
    return message


def test_pack_unpack_round_trip() -> None:
    message = {"op": "execute", "msg_id": "1", "session": "s", "source": "x = 1", "blob": b"\x00"}
    assert unpack(pack(message)) == message


def test_oversized_frame_is_rejected() -> None:
    frame = pack({"op": "ping", "msg_id": "1", "pad": "x" * 200})
    with pytest.raises(ProtocolError, match="exceeds"):
        unpack(frame, max_size=100)
    assert unpack(frame, max_size=len(frame))["op"] == "ping"


@pytest.mark.parametrize("frame", [
    b"",
    b"\xc1",
    b"\x92\x01",  # a truncated array
    b"\x81\xa2op",  # a truncated map
    pack({"op": "ping"}) + b"\x00",  # trailing bytes
    b"\xa2\xff\xfe",  # invalid UTF-8 in a string
    msgpack.packb({1: "int key"}),
], ids=["empty", "reserved", "truncated-array", "truncated-map", "extra", "bad-utf8", "int-key"])
def test_non_msgpack_bytes_are_rejected(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        unpack(frame)


@pytest.mark.parametrize("payload", [[1, 2], "op", 5, None, b"bytes"])
def test_non_map_payloads_are_rejected(payload: object) -> None:
    with pytest.raises(ProtocolError, match="not a map"):
        unpack(pack(payload))  # type: ignore[arg-type]


def _req(**fields: object) -> dict:
    return {"op": "execute", "msg_id": "m1", "session": "nb", "source": "x = 1", **fields}


def test_valid_requests_are_accepted_unchanged() -> None:
    for message in (
        _req(),
        _req(cell_id="c1", cwd="/tmp"),
        {"op": "ping", "msg_id": "m"},
        {"op": "status", "msg_id": "m"},
        {"op": "open", "msg_id": "m", "session": "a-B_9.x"},
        {"op": "draft", "msg_id": "m", "session": "s", "source": ""},
        {"op": "interrupt", "msg_id": "m", "session": "s"},
        {"op": "close", "msg_id": "m", "session": "s" * 128},
    ):
        assert check_request(message) is message


def test_every_client_op_is_checkable() -> None:
    for op in CLIENT_OPS:
        check_request({"op": op, "msg_id": "m", "session": "s", "source": "", "version": 1,
                       "name": "n", "cursor": 0, "host": "h", "user": "u", "wake_dir": "/w",
                       "image": {}, "msg_type": "comm_msg", "content": {}})


@pytest.mark.parametrize("field, value", [
    ("stdin", "yes"), ("version", 3.5), ("name", 5), ("version", True), ("value", 5),
    ("error", None), ("cursor", "3"), ("detail", 1.5),
])
def test_wrongly_typed_fields_are_rejected(field: str, value: object) -> None:
    with pytest.raises(ProtocolError, match=field):
        check_request({"op": "execute", "msg_id": "m", "session": "s", "source": "",
                       field: value})


@pytest.mark.parametrize("message", [
    {"msg_id": "m"},
    {"op": None, "msg_id": "m"},
    {"op": 3, "msg_id": "m"},
], ids=["absent", "none", "int"])
def test_missing_op_is_rejected(message: dict) -> None:
    with pytest.raises(ProtocolError, match="no 'op'"):
        check_request(message)


@pytest.mark.parametrize("op", ["shutdown", "EXECUTE", "", "reply"])
def test_unknown_op_is_rejected(op: str) -> None:
    with pytest.raises(ProtocolError, match="unknown op") as info:
        check_request({"op": op, "msg_id": "m"})
    assert info.value.to_wire()["kind"] == "protocol"


@pytest.mark.parametrize("msg_id", [None, 5, b"m"])
def test_missing_or_non_string_msg_id_is_rejected(msg_id: object) -> None:
    message = _req(msg_id=msg_id)
    with pytest.raises(ProtocolError, match="msg_id"):
        check_request(message)
    del message["msg_id"]
    with pytest.raises(ProtocolError, match="msg_id"):
        check_request(message)


@pytest.mark.parametrize(("op", "missing"), [
    ("execute", "source"),
    ("execute", "session"),
    ("draft", "source"),
    ("open", "session"),
    ("interrupt", "session"),
    ("close", "session"),
])
def test_missing_required_fields_are_rejected(op: str, missing: str) -> None:
    message = {"op": op, "msg_id": "m", "session": "s", "source": "x"}
    del message[missing]
    with pytest.raises(ProtocolError, match=f"needs field '{missing}'"):
        check_request(message)


@pytest.mark.parametrize(("field", "value"), [
    ("source", b"x = 1"),
    ("source", None),
    ("source", ["x"]),
    ("session", 3),
    ("cwd", 1),
    ("cell_id", {"id": 1}),
])
def test_non_string_fields_are_rejected(field: str, value: object) -> None:
    with pytest.raises(ProtocolError, match="must be a string"):
        check_request(_req(**{field: value}))


@pytest.mark.parametrize("name", [
    "../x", "", "a" * 200, "a" * 129, "a/b", ".hidden", "..", "a b", "naïve", "a\\b", "a\x00",
])
def test_bad_session_names_are_rejected(name: str) -> None:
    with pytest.raises(ProtocolError, match="session names"):
        check_request(_req(session=name))


@pytest.mark.parametrize("frame, msg_id", [
    (pack({"op": "execute", "msg_id": "7", "source": "x" * 200_000}), "7"),
    (pack({"source": "x" * 200_000, "msg_id": "7"}), None),  # past the peeked window
    (pack({"msg_id": 7}), None),
    (pack([1, 2]), None),
    (b"\xc1garbage", None),
    (b"\x00" * 100, None),
])
def test_the_msg_id_of_a_refused_frame_is_read_from_its_start(frame: bytes, msg_id) -> None:
    assert peek_msg_id(frame) == msg_id

"""Fuzzed frames against a real server: every frame is answered, none is an internal error, and
the server keeps serving. CI runs a seeded, bounded number of frames (LLFABRIC_FUZZ_FRAMES, 300).

No generated request can open a session, so every session op meets an unknown session: the frames
exercise decoding, validation and dispatch, not cells.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import msgpack
import pytest
import zmq
from helpers import RunningServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabric import messages, protocol

FRAMES = int(os.environ.get("LLFABRIC_FUZZ_FRAMES", "300"))

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
           | st.text(max_size=40) | st.binary(max_size=40))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
ops = st.sampled_from(sorted(messages.CLIENT_OPS - {"open"})) | st.text(max_size=12)
fields = st.sampled_from(["session", "source", "cwd", "version", "name", "value", "error",
                          "stdin", "cell_id", "timeout"])
requests = st.fixed_dictionaries(
    {"op": ops | values, "msg_id": st.just("fuzz")},
    optional={"extra": st.dictionaries(fields, values | st.text(max_size=130), max_size=5)},
).map(lambda m: {**m.pop("extra", {}), **m})
frames = (st.binary(max_size=200)
          | requests.map(lambda m: protocol.pack(m))
          | values.map(lambda v: msgpack.packb(v, use_bin_type=True)))


@contextlib.contextmanager
def dealer_on(address: str) -> Iterator[zmq.Socket]:
    """A bare DEALER socket connected to the server at `address`: frames go out as they are."""
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(address)
    try:
        yield socket
    finally:
        socket.close()
        context.term()


@pytest.fixture(scope="module")
def dealer(server: RunningServer) -> Iterator[zmq.Socket]:
    with dealer_on(server.address) as socket:
        yield socket


def _ask(socket: zmq.Socket, frame: bytes) -> dict:
    """Send one frame with a fresh msg_id where it has one; the server's answer to it."""
    msg_id = protocol.peek_msg_id(frame)
    if msg_id == "fuzz":  # requests carry a placeholder: give each a unique id to match on
        msg_id = uuid.uuid4().hex
        frame = protocol.pack({**protocol.unpack(frame), "msg_id": msg_id})
    socket.send(frame)
    while True:
        assert socket.poll(30_000), f"no answer to {frame[:80]!r}"
        answer = protocol.unpack(socket.recv(), max_size=1 << 31)
        if answer.get("type") == "heartbeat":
            continue
        if msg_id is None or answer.get("msg_id") == msg_id:
            return answer


@settings(max_examples=FRAMES, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(frame=frames)
def test_every_frame_gets_an_answer_that_is_not_an_internal_error(dealer, frame: bytes) -> None:
    answer = _ask(dealer, frame)
    assert answer["type"] in ("reply", "error"), answer
    if answer["type"] == "error":
        assert answer["error"]["kind"] != "internal", answer


def test_the_server_serves_on_after_the_fuzzing(server: RunningServer) -> None:
    assert server.alive()
    with server.client() as client:
        assert client.ping(timeout=5)
        assert client.status().sessions == ()  # no fuzzed frame opened one

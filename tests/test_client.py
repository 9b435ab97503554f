"""The client against a scripted server on a real ROUTER socket: routing of overlapping requests,
the typed events of a cell, a silent cell probed with pings, and frames that are no message."""

from __future__ import annotations

import gc
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from fabric.client import Client, listening
from fabric.errors import ProtocolError, RemoteError, Unreachable
from fabric.messages import (
    ClosureSummary,
    Error,
    Executed,
    Heartbeat,
    Interrupt,
    Notice,
    Output,
    Ping,
    Pong,
    Queued,
    Request,
)
from fabric.protocol import pack, unpack

Script = Callable[[Request, str], list[dict]]  # a request and its msg_id -> the frames to send


class Scripted:
    """A ROUTER that answers each request with the frames its script returns."""

    def __init__(self, address: str, script: Script) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.bind(address)
        self.script = script
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.socket.poll(20):
                continue
            identity, frame = self.socket.recv_multipart()
            message = unpack(frame)
            for answer in self.script(Request.from_wire(message), message["msg_id"]):
                self.socket.send_multipart([identity, pack(answer)])

    def close(self) -> None:
        self._stop.set()
        self.thread.join()
        self.socket.close()
        self.context.term()


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[Callable[[Script], Client]]:
    """A client of a scripted server: `scripted(script)`."""
    opened: list[Scripted | Client] = []

    def start(script: Script) -> Client:
        address = f"ipc://{tmp_path}/s.sock"
        opened.append(Scripted(address, script))
        opened.append(Client(address, timeout=5))
        return opened[-1]

    yield start
    for thing in reversed(opened):
        thing.close()


OUT = {"output_type": "stream", "name": "stdout", "text": "hi\n"}


def _ended(status: str) -> Executed:
    """A cell's reply, ended with `status`."""
    return Executed(status, None, 1, 1, (), (), "warm", "warm", "zygote",
                    ClosureSummary((), 0, 0, False, True, 0), {}, (), ())


OK, FAILED = _ended("ok"), _ended("error")


def test_a_cell_streams_typed_events_then_its_reply(scripted) -> None:
    def script(request: Request, msg_id: str) -> list[dict]:
        return [Queued(1, 1).to_wire(msg_id), Heartbeat().to_wire(), Output(OUT).to_wire(msg_id),
                Notice("queued", "waited", 1.0).to_wire(msg_id),
                OK.to_wire(msg_id)]

    client = scripted(script)
    assert list(client.execute("s", "print('hi')")) == [
        Queued(1, 1), Output(OUT), Notice("queued", "waited", 1.0), OK]
    assert client.call("execute", session="s", source="1") == OK


def test_frames_of_overlapping_requests_reach_each_in_order(scripted) -> None:
    cell: dict[str, str] = {}

    def script(request: Request, msg_id: str) -> list[dict]:
        if isinstance(request, Ping):  # the cell's frames around the ping's reply
            return [Output(OUT).to_wire(cell["id"]), Pong(True, 1, "me").to_wire(msg_id),
                    OK.to_wire(cell["id"])]
        cell["id"] = msg_id
        return []

    client = scripted(script)
    events = client.execute("s", "1")
    assert client.request(Ping()) == Pong(True, 1, "me")
    assert list(events) == [Output(OUT), OK]


def test_requests_about_a_running_cell_are_answered_aside(scripted) -> None:
    cell: dict[str, str] = {}

    def script(request: Request, msg_id: str) -> list[dict]:
        if isinstance(request, Interrupt):
            return [Error({"kind": "fabric", "message": "no cell"}).to_wire(msg_id),
                    FAILED.to_wire(cell["id"])]
        cell["id"] = msg_id
        return [Output(OUT).to_wire(msg_id)]

    client = scripted(script)
    events = client.execute("s", "1")
    assert next(events) == Output(OUT)
    events.send(Interrupt("s"))  # its error is logged, not the cell's
    assert list(events) == [FAILED]


def test_a_silent_cell_is_probed_and_waited_for(scripted) -> None:
    cell: dict[str, str] = {}
    pings: list[str] = []

    def script(request: Request, msg_id: str) -> list[dict]:
        if request.op == "ping":
            pings.append(msg_id)
            frames = [Pong(True, 1, "me").to_wire(msg_id)]
            return frames + ([OK.to_wire(cell["id"])] if len(pings) == 3
                             else [])
        cell["id"] = msg_id
        return []

    client = scripted(script)
    assert list(client.execute("s", "1", timeout=0.2)) == [OK]
    assert len(pings) == 3


def test_a_server_that_stops_answering_is_unreachable(scripted) -> None:
    client = scripted(lambda request, msg_id: [])
    with pytest.raises(Unreachable):
        list(client.execute("s", "1", timeout=0.2))
    with pytest.raises(Unreachable):
        client.draft("s", "1", timeout=0.2)
    assert not client.ping(timeout=0.2)


@pytest.mark.parametrize("frame", [
    {"type": "event", "event": "progress", "percent": 5},
    {"type": "event", "event": "output", "output": "not a map"},
    {"type": "outcome"},
], ids=["unknown-event", "bad-field", "unknown-type"])
def test_a_frame_that_is_no_message_is_an_error_not_dropped(scripted, frame: dict) -> None:
    client = scripted(lambda request, msg_id: [{**frame, "msg_id": msg_id}])
    with pytest.raises(ProtocolError):
        list(client.execute("s", "1"))


def test_an_error_reply_raises_it(scripted) -> None:
    client = scripted(lambda request, msg_id: [
        Error({"kind": "busy", "message": "a cell runs", "session": "s"}).to_wire(msg_id)])
    with pytest.raises(RemoteError) as err:
        client.interrupt("s")
    assert err.value.kind == "busy" and err.value.fields == {"session": "s"}


def test_listening_tells_a_busy_server_from_a_down_one(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    assert not listening(f"ipc://{path}")  # no socket
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen()
        assert listening(f"ipc://{path}")  # accepts, whether or not it answers
    assert not listening(f"ipc://{path}")  # the file is left, nobody listens
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert listening(f"tcp://127.0.0.1:{port}")
    assert not listening(f"tcp://127.0.0.1:{port}")
    assert not listening("tcp://127.0.0.1:notaport") and not listening("inproc://x")


def test_a_client_dropped_unclosed_is_closed_by_whichever_thread_collects_it(
        tmp_path: Path) -> None:
    def drop() -> None:
        client = Client(f"ipc://{tmp_path}/nobody.sock")
        client.cycle = client  # only the cycle collector frees it, in an order of its own
        del client
        gc.collect()

    collector = threading.Thread(target=drop, daemon=True)
    collector.start()
    collector.join(60)
    assert not collector.is_alive(), "collecting an unclosed client hung"

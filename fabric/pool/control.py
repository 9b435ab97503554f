"""Framing of the zygote control channel: one msgpack map per SOCK_SEQPACKET packet.

Also the two facts a dormant worker (see `dormant`) and the server agree on without a channel:
the signal that wakes a restored copy and the endpoint it then connects to.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import msgpack

PACKET = 1 << 20  # largest control packet
WAKE = signal.SIGUSR1


def restored_socket(socket_dir: Path, init_pid: int) -> Path:
    """Where the server waits for the copy restored under the init with host pid `init_pid`."""
    return socket_dir / f"r{init_pid}.sock"


def send(ctrl: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = msgpack.packb(message, use_bin_type=True)
    if fds:
        socket.send_fds(ctrl, [data], fds)
    else:
        ctrl.send(data)


def decode(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False)

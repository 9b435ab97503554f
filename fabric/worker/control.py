"""Framing of the zygote control channel: one msgpack map per SOCK_SEQPACKET packet."""

from __future__ import annotations

import socket

import msgpack

PACKET = 1 << 20  # largest control packet


def send(ctrl: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = msgpack.packb(message, use_bin_type=True)
    if fds:
        socket.send_fds(ctrl, [data], fds)
    else:
        ctrl.send(data)


def decode(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False)

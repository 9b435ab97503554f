"""Partitions and pauses, made for real between processes of this machine.

A `Relay` carries one TCP address's connections through this process; cut, it passes nothing
either way and closes nothing, as a network that drops every packet: the connections stay
open, what is sent waits in the sockets' buffers (or the relay's), and a connection made
meanwhile hangs before it reaches the far end. Healed, what waited passes on, in order, as TCP
delivers it once a partition ends. `paused` stops a process and every process under it
(SIGSTOP) and lets them go on (SIGCONT): alive, but silent. `kill` ends them at once, as a host
whose power is cut.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator

import psutil


class Relay:
    """Connections to `target` (tcp://HOST:PORT), made to `address` instead; `dial` makes the
    far end's connection (where it is reached from elsewhere than this process's network)."""

    def __init__(self, target: str, dial: Callable[[tuple[str, int]], socket.socket] =
                 socket.create_connection) -> None:
        self.target = target
        self._dial = dial
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self._far = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._flowing = threading.Event()
        self._flowing.set()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="relay").start()

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()  # its threads end on the sockets closed under them
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:  # closed
                return
            self._flowing.wait()
            try:
                far = self._dial(self._far)
            except OSError:  # the far end is not listening: nor is this connection
                near.close()
                continue
            if self._closed:
                near.close()
                far.close()
                return
            self._sockets += [near, far]
            for src, dst in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True,
                                 name="relay-pump").start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Bytes from `src` to `dst` while the relay flows; an end closed closes the other."""
        try:
            while chunk := src.recv(1 << 16):
                self._flowing.wait()
                dst.sendall(chunk)
        except OSError:
            pass
        self._flowing.wait()
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def paused(pid: int) -> Iterator[list[psutil.Process]]:
    """Process `pid` and everything under it stopped for the block (a process is stopped before
    its children are listed, so that none it forks escapes), then resumed."""
    stopped: list[psutil.Process] = []
    waiting = [psutil.Process(pid)]
    while waiting:
        process = waiting.pop()
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGSTOP)
            stopped.append(process)
            waiting += process.children()
    try:
        yield stopped
    finally:
        for process in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)


def kill(pid: int) -> None:
    """Process `pid` and everything under it killed (SIGKILL), all stopped first, so that none
    outlives the others long enough to notice."""
    with paused(pid) as stopped:
        for process in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()

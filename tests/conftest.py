"""Fixtures that start real servers: `llfabric serve` in a subprocess, a store in a temp dir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.client import Client

ROOT = Path(__file__).resolve().parent.parent


class RunningServer:
    def __init__(self, store: Path, address: str, process: subprocess.Popen, log: Path) -> None:
        self.store = store
        self.address = address
        self.process = process
        self.log = log

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.address, timeout=timeout)

    def alive(self) -> bool:
        return self.process.poll() is None


def start_server(store: Path, sockdir: Path, env: dict | None = None) -> RunningServer:
    address = f"ipc://{sockdir}/s.sock"
    log = store.parent / f"server-{uuid.uuid4().hex[:6]}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--store", str(store), "--bind", address],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            start_new_session=True)
    server = RunningServer(store, address, process, log)
    deadline = time.monotonic() + 60
    with server.client() as client:
        while not client.ping(timeout=0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{log.read_text()}")
    return server


def stop_server(server: RunningServer) -> None:
    if server.alive():
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    store = tmp_path_factory.mktemp("store")
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:  # ipc paths must stay short
        running = start_server(store, Path(sockdir))
        yield running
        stop_server(running)
        assert running.process.returncode == 0, running.log.read_text()


@pytest.fixture
def client(server: RunningServer) -> Iterator[Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def session(client: Client, tmp_path: Path) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.call("open", session=name, cwd=str(tmp_path))
    return name

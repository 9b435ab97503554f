"""Fixtures that start real servers: `llfabric serve` in a subprocess, a store in a temp dir."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.client import Client
from fabric.config import Config
from fabric.embedded import EmbeddedServer


class RunningServer(EmbeddedServer):
    """A real `llfabric serve` in a subprocess, with its store in a temp dir."""

    @property
    def store(self) -> Path:
        return self.config.store

    @property
    def address(self) -> str:
        return self.config.address

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.address, timeout=timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def start_server(store: Path, sockdir: Path) -> RunningServer:
    server = RunningServer(Config(store=store, runtime_dir=sockdir, bind=f"ipc://{sockdir}/s.sock"))
    server.start()
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    store = tmp_path_factory.mktemp("store")
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:  # ipc paths must stay short
        running = start_server(store, Path(sockdir))
        yield running
        running.stop()
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

"""Fixtures that start real servers: `llfabric serve` in a subprocess, a store in a temp dir."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import RunningServer, start_server

from fabric.client import Client


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

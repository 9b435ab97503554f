"""Fixtures that start real servers: `llfabric serve` in a subprocess, a store in a temp dir."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import RunningServer, open_session, serving

from fabric.client import Client

# The machine's memory is shared with whatever runs beside the suite: a server under test sheds
# kept workers only for pressure its own test sets up (those tests set these themselves).
os.environ.setdefault("LLFABRIC_MEMORY_PRESSURE", "100")
os.environ.setdefault("LLFABRIC_MEMORY_STALL", "0")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # Every cell on a fresh worker loaded with its closure (no warm worker kept between cells):
    # each cell's state makes the round trip through the store (warm workers:
    # tests/integration/test_warm.py).
    with serving(tmp_path_factory.mktemp("store"), keep_warm=0) as running:
        yield running


@pytest.fixture
def client(server: RunningServer) -> Iterator[Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def session(client: Client, tmp_path: Path) -> str:
    return open_session(client, tmp_path)

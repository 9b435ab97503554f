"""What a server tells Prometheus: cells by path and outcome, their waits, failures, commits,
leases and sessions, and connections it refused, scraped over HTTP from a real server."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
import zmq
from helpers import execute, open_session, serving
from prometheus_client.parser import text_string_to_metric_families

from fabric.auth import ClientKey, Keys, write_client_key
from fabric.client import Client
from fabric.errors import Forbidden


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_a_scrape_counts_cells_waits_failures_leases_sessions_and_refusals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = Keys(tmp_path / "keys")
    write_client_key(tmp_path / "keys" / "client.key", keys.new_client("alice"))
    monkeypatch.setenv("LLFABRIC_KEY_DIR", str(tmp_path / "keys"))
    port = _port()
    with serving(tmp_path / "store", bind=f"tcp://127.0.0.1:{_port()}", slots=2, keep_warm=0,
                 metrics_bind=f"127.0.0.1:{port}") as server, \
            server.client(timeout=120) as client:
        session = open_session(client, tmp_path)
        assert execute(client, session, "x = 1")[0]["status"] == "ok"
        assert execute(client, session, "1 / 0")[0]["status"] == "error"
        public, secret = zmq.curve_keypair()
        stranger = ClientKey("eve", public.decode(), secret.decode(), keys.server_pair()[0])
        with Client(server.address, timeout=5, key=stranger) as refused, \
                pytest.raises(Forbidden):
            refused.ping(timeout=2)
        metrics = _scrape(port)
    cells = {labels: value for (name, labels), value in metrics.items()
             if name == "llfabric_cells_total"}
    assert sum(cells.values()) == 2
    assert sum(v for labels, v in cells.items() if ("status", "error") in labels) == 1
    assert metrics[("llfabric_cell_failures_total", (("reason", "ZeroDivisionError"),))] == 1
    assert metrics[("llfabric_commits_total", ())] == 2
    assert metrics[("llfabric_cell_visible_delay_seconds_count", ())] == 2
    assert sum(v for (name, _), v in metrics.items() if name == "llfabric_drafts_total") == 2
    assert metrics[("llfabric_lease_slots", ())] == 2
    assert metrics[("llfabric_leases_held", ())] == 0
    assert sum(v for (name, _), v in metrics.items() if name == "llfabric_sessions") == 1
    assert metrics[("llfabric_auth_failures_total", ())] >= 1

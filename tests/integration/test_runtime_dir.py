"""A server's runtime folder (its workers' sockets, CRIU images) outlives a server killed with
SIGKILL, which cannot remove it: the next server started removes it, and no live server's."""

from __future__ import annotations

import tempfile
from pathlib import Path

from helpers import serving, start_server


def _runtime_folder(server) -> Path:
    with server.client() as client:
        return Path(client.call("ping").wake_dir)


def test_a_killed_servers_runtime_folder_goes_when_the_next_server_starts(tmp_path) -> None:
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:
        killed = start_server(tmp_path / "killed", Path(sockdir))
        try:
            left = _runtime_folder(killed)
        finally:
            killed.process.kill()
            killed.process.wait()
        assert left.is_dir()
    with serving(tmp_path / "live") as live, serving(tmp_path / "next") as started:
        assert not left.exists()
        assert _runtime_folder(live).is_dir() and _runtime_folder(started).is_dir()

"""A store's remote tier on real servers: every commit is there before its cell's reply, and a
host with an empty disk (sharing only the store's key and the remote) takes the session up from
its last version there, as after losing the first host."""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers import execute, serving, text


def test_a_host_with_an_empty_disk_goes_on_from_the_remote(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    first, second = tmp_path / "first", tmp_path / "second"
    with serving(first, keep_warm=0, remote=f"file://{remote}") as server, \
            server.client() as client:
        client.call("open", session="nb", cwd=str(tmp_path))
        execute(client, "nb", "import numpy as np\nx = [1, 2]\na = np.arange(3_000_000)")
        reply, _ = execute(client, "nb", "x.append(3)")
        assert reply["status"] == "ok" and reply["version"] == 2
        # before the reply: every blob of that version is on the remote
        blobs = {p.name for p in (first / "blobs").rglob("*") if p.is_file()}
        assert blobs <= {p.name for p in (remote / "blobs").rglob("*") if p.is_file()}
    second.mkdir()
    shutil.copy(first / "key", second / "key")  # the hosts' shared secret: never on the remote
    with serving(second, keep_warm=0, remote=f"file://{remote}") as server, \
            server.client() as client:
        client.call("open", session="nb", cwd=str(tmp_path))
        reply, outputs = execute(client, "nb", "print(x, int(a.sum()))\ny = len(x)")
        assert text(outputs) == f"[1, 2, 3] {sum(range(3_000_000))}\n"
        assert reply["version"] == 3
    assert (remote / "sessions" / "nb" / "head").read_text().strip() \
        == (second / "sessions" / "nb" / "head").read_text().strip()

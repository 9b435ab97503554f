"""A pinned session carried between two servers of this machine as a cluster's door carries it
(`emigrate`, `immigrate`), to a host whose store and notebook directory lie at other paths, the
old ones gone, and where the worker's old pid is taken: its worker is restored there all the same.

Needs root, CRIU, pycriu and llfabric-init (skipped without them, failed under CI).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
from helpers import execute, holding_pid, require_criu, serving, text

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _needs_criu() -> None:
    require_criu("carrying a worker")


def _copy_blobs(source: Path, target: Path) -> None:
    """What the receiving host's peer tier fetches from the sending one, here by a copy."""
    for blob in (source / "blobs").rglob("*"):
        copy = target / "blobs" / blob.relative_to(source / "blobs")
        if blob.is_file() and not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(blob, copy)


def _copy_if_there(source: str, target: str) -> None:
    """A copy of a file of a live store, which its server may remove meanwhile (a mark its
    upkeep pass has taken)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(source, target)


@pytest.mark.parametrize("directory", ["there", "missing"])
def test_a_pinned_worker_is_carried_to_a_host_with_other_paths(tmp_path: Path,
                                                               directory: str) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    (here / "notebooks").mkdir(parents=True)
    cwd = there / ("notebooks" if directory == "there" else "gone")
    cwd.mkdir(parents=True)
    with serving(here / "store", linger=0, keep_warm=0) as sender, sender.client() as a:
        a.call("open", session="carried", cwd=str(here / "notebooks"))
        reply, outputs = execute(a, "carried", (
            "import os\nnumbers = (i * i for i in range(10))\nfirst = next(numbers)\n"
            "print(os.getpid())"))
        assert reply["unsaved"] == ["numbers"], outputs
        old = int(text(outputs))
        # the other host: a copy of this one's store so far, at another path
        shutil.copytree(here / "store", there / "store", symlinks=True,
                        copy_function=_copy_if_there)
        with serving(there / "store", linger=0, keep_warm=0) as receiver, \
                receiver.client() as b:
            pong = b.call("ping")
            image = a.call("emigrate", session="carried", user=pong.user,
                           wake_dir=pong.wake_dir).image
            assert image is not None
            _copy_blobs(here / "store", there / "store")
            sender.stop()
            shutil.rmtree(here)
            b.call("open", session="carried", cwd=str(cwd))
            if directory == "missing":  # gone since (a host's open refuses a missing one)
                cwd.rmdir()
            assert b.call("immigrate", session="carried", user=pong.user, image=image).arrived
            with holding_pid(old):
                reply, outputs = execute(b, "carried",
                                         "print(first, next(numbers), os.getpid(), os.getcwd())")
            assert reply["status"] == "ok" and reply["source"] == "cool", outputs
            assert not here.exists()  # its old store's path, put back for the restore only
            notices = [n["text"] for n in reply["notices"] if n["topic"] == "directory"]
            if directory == "there":
                assert text(outputs) == f"0 1 {old} {cwd}\n" and not notices
            else:
                assert text(outputs) == f"0 1 {old} /\n"
                assert notices == [f"the notebook's directory {cwd} is not on this host (No "
                                   "such file or directory): its cells run in /"]
            reply, outputs = execute(b, "carried", "saved = first + 1\nprint(saved)")
            assert text(outputs) == "1\n" and reply["status"] == "ok"

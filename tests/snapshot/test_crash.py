"""Crash safety: a saver killed at any point, or stopped by a full disk, loses nothing committed."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fabric.errors import StoreError
from fabric.snapshot import Group, Manifest, Store, dumps, history, loads

ROOT = Path(__file__).resolve().parent.parent.parent

# Commits versions forever, as a worker and the server do together: objects, manifest, head.
SAVER = """
import sys
from pathlib import Path
import numpy as np
from fabric.snapshot import Group, Manifest, Store, dumps
store = Store(Path(sys.argv[1]), chunk=1 << 16)
head = store.head("s")
version = Manifest.decode(store.get_manifest(head)).version if head else 0
print("ready", flush=True)
while True:
    version += 1
    data = np.full(200_000, float(version))
    blob = store.put_object(dumps({"data": data, "version": version}, {}))
    group = Group(blob, ("data", "version"), 1)
    m = Manifest(session="s", version=version, parent=head, groups=(group,))
    head = store.put_manifest(m.encode())
    store.set_head("s", head)
"""


def _check(store: Store) -> int:
    """The head loads, verifies and holds the state of its version; returns that version."""
    manifest = Manifest.decode(store.get_manifest(store.head("s")))
    values = loads(store.get_object(manifest.groups[0].blob), {})
    assert values["version"] == manifest.version
    assert np.all(values["data"] == manifest.version)
    assert not history.verify(store).problems
    return manifest.version


def test_kill_9_at_random_points_never_breaks_the_committed_head(tmp_path: Path) -> None:
    rng = random.Random(5)
    last = 0
    for _ in range(8):
        child = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        if Store(tmp_path).head("s") is not None:
            version = _check(Store(tmp_path))
            assert version >= last
            last = version
    assert last > 0


def test_a_full_disk_gives_a_clear_error_and_keeps_the_last_version(tmp_path: Path) -> None:
    store = Store(tmp_path, chunk=1 << 16)
    blob = store.put_object(dumps({"data": np.ones(10), "version": 1}, {}))
    m = Manifest(session="s", version=1, groups=(Group(blob, ("data", "version"), 1),))
    store.set_head("s", store.put_manifest(m.encode()))
    # a file size limit stands in for a full disk: writes past it fail with an OSError
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "import numpy as np\n"
        "from fabric.snapshot import Store, dumps\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 15, 1 << 15))\n"
        "store = Store(Path(sys.argv[1]), chunk=1 << 16)\n"
        "try:\n"
        "    store.put_object(dumps({'data': np.random.random(100_000), 'version': 2}, {}))\n"
        "except OSError as exc:\n"
        "    print('refused:', exc)\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert "refused: [Errno 27] File too large" in result.stdout, result.stderr
    assert _check(Store(tmp_path)) == 1
    assert not [p for p in (tmp_path / "blobs").rglob(".tmp-*")]  # no half-written leftovers


def test_store_errors_name_the_bad_blob(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="missing"):
        Store(tmp_path).get_object("0" * 32)

"""The `track_writes` setting reaches the workers: off, a worker never asks the kernel to track
its buffers' writes (it opens no userfaultfd), neither for what it loads nor for what its cells
make; on, it does where the kernel can. A real server, a fresh worker for each cell."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import execute, open_session, serving, text

from fabric.snapshot import written

pytestmark = pytest.mark.timeout(180)

# whether this worker process holds a userfaultfd: what write tracking opens
TRACKING = """
import os
links = []
for fd in os.listdir('/proc/self/fd'):
    try:
        links.append(os.readlink(f'/proc/self/fd/{fd}'))
    except OSError:  # the listing's own descriptor, closed by now
        pass
print(any('userfaultfd' in link for link in links))
"""


@pytest.mark.parametrize("setting", [0, 1])
def test_a_worker_tracks_writes_only_where_the_setting_says(tmp_path: Path, setting: int) -> None:
    if setting and written.tracker() is None:
        pytest.skip(f"this kernel does not track writes: {written.why()}")
    with serving(tmp_path / "store", track_writes=setting, keep_warm=0) as server, \
            server.client() as client:
        session = open_session(client, tmp_path)
        reply, _ = execute(client, session, "import numpy as np\nx = np.zeros(1 << 20)")
        assert reply["status"] == "ok", reply
        _, outputs = execute(client, session, f"x[7] = 1\n{TRACKING}")  # x loaded first
        assert text(outputs) == f"{bool(setting)}\n"
        _, outputs = execute(client, session, f"print(int(x.sum()), int(x[7]))\n{TRACKING}")
        assert text(outputs) == f"1 1\n{bool(setting)}\n"

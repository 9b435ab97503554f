"""Real CRIU round trip through pycriu: dump a live Python process, restore it, check its state.

Needs the CRIU provisioned by scripts/provision-criu.sh (.criu/bin/criu, pycriu in the venv) and
root. Skipped when that CRIU is missing, except under CI, where a missing CRIU is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CRIU_BIN = REPO / ".criu" / "bin" / "criu"

# The checkpointed process: a secret token and a counter that live only in its memory; it
# publishes both (atomically, via rename) to state.json every 20 ms. It keeps no file open, so
# the dump holds nothing but memory, /dev/null stdio and its cwd.
CHILD = r"""
import json, os, sys, time
token = os.urandom(16).hex()
counter = 0
while True:
    counter += 1
    with open("state.tmp", "w") as f:
        json.dump({"pid": os.getpid(), "token": token, "counter": counter}, f)
    os.replace("state.tmp", "state.json")
    time.sleep(0.02)
"""


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _criu_binary() -> Path:
    """The provisioned criu, or skip (fail under CI) when it is absent."""
    if not (CRIU_BIN.exists() and os.access(CRIU_BIN, os.X_OK)):
        msg = f"{CRIU_BIN} missing; run `bash scripts/provision-criu.sh` (or `make criu`)"
        if _in_ci():
            pytest.fail(msg + " -- CRIU is required under CI", pytrace=False)
        pytest.skip(msg)
    if os.geteuid() != 0:
        pytest.skip("CRIU dump/restore needs root (CAP_SYS_ADMIN, CAP_CHECKPOINT_RESTORE, ...)")
    return CRIU_BIN


def _pycriu():
    try:
        import pycriu  # provisioned into the venv by scripts/provision-criu.sh
    except ImportError as e:
        msg = f"pycriu not importable ({e}); run `bash scripts/provision-criu.sh`"
        if _in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return pycriu


def _read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _wait_state(path: Path, pred, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = _read_state(path)
        if state is not None and pred(state):
            return state
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting on {path}; last state: {state}")


def _log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return f"(no {path.name})"


def _new_criu(pycriu, criu_bin: Path, images_fd: int, log_name: str):
    c = pycriu.criu()
    c.use_binary(str(criu_bin))  # swrk mode: pycriu forks/execs `criu swrk <sk>` per request
    # Pass the images dir as an fd of ours (criu opens /proc/<our pid>/fd/N). The string field
    # `images_dir` is no good in 4.1.1: the service readlink()s the path, which fails with EINVAL
    # for a real directory ("Bad options").
    c.opts.images_dir_fd = images_fd
    c.opts.log_file = log_name  # written inside the images dir
    c.opts.log_level = 4
    return c


def _reap(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def test_pycriu_reports_version():
    _criu_binary()
    pycriu = _pycriu()
    assert int(pycriu.__version__.split(".")[0]) >= 4


@pytest.mark.timeout(120)
def test_dump_and_restore_keeps_process_memory(tmp_path: Path):
    criu_bin = _criu_binary()
    pycriu = _pycriu()

    work = tmp_path / "work"
    images = tmp_path / "images"
    work.mkdir()
    images.mkdir()
    state_file = work / "state.json"

    # Own session (so it is not a "shell job"), no pipes or ttys to the outside: stdio is
    # /dev/null, which CRIU reopens by path on restore.
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    restored_pid = None
    images_fd = os.open(images, os.O_RDONLY | os.O_DIRECTORY)
    try:
        before = _wait_state(state_file, lambda s: s["counter"] >= 10)
        assert before["pid"] == child.pid

        dumper = _new_criu(pycriu, criu_bin, images_fd, "dump.log")
        dumper.opts.pid = child.pid
        dumper.opts.leave_running = False  # CRIU kills the tree once the images are written
        try:
            dumper.dump()
        except pycriu.CRIUException as e:
            pytest.fail(f"criu dump failed: {e}\n{_log_tail(images / 'dump.log')}")

        # The dumped process is gone; reap it so its PID is free for the restore.
        assert child.wait(timeout=10) == -signal.SIGKILL
        at_dump = _read_state(state_file)
        assert at_dump is not None and at_dump["token"] == before["token"]
        assert at_dump["counter"] >= before["counter"]
        time.sleep(0.2)
        assert _read_state(state_file) == at_dump, "state changed while the process was dumped"
        assert any(images.glob("pages-*.img")), sorted(p.name for p in images.iterdir())

        restorer = _new_criu(pycriu, criu_bin, images_fd, "restore.log")
        restorer.opts.rst_sibling = True  # the restored process becomes our child
        try:
            resp = restorer.restore()
        except pycriu.CRIUException as e:
            pytest.fail(f"criu restore failed: {e}\n{_log_tail(images / 'restore.log')}")
        restored_pid = resp.pid
        assert restored_pid == child.pid, "CRIU restores the original PID"

        # Same token (memory came back, not a fresh start) and the counter carries on past the
        # value it had reached when dumped instead of starting again from 1.
        after = _wait_state(state_file, lambda s: s["counter"] > at_dump["counter"] + 5)
        assert after["token"] == before["token"]
        assert after["pid"] == child.pid
    finally:
        os.close(images_fd)
        if child.returncode is None:
            child.kill()
            child.wait()
        if restored_pid is not None:
            _reap(restored_pid)

"""An embedded server: started by a client when none answers, stopped when the client is done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import stacks
from .client import Client
from .config import Config
from .errors import Unreachable
from .private import log_tail, open_private, private_dir

# seconds a live server may take to answer: one that dies ends the wait at once, so this bounds a
# hang, and a loaded host's first imports (a zygote's torch, a door's hosts) can take minutes
START_TIMEOUT = 300.0
STOP_TIMEOUT = 15.0  # seconds a server has to end after SIGTERM


class EmbeddedServer:
    """`llfabric serve` as a child process; `env` replaces the environment workers inherit."""

    def __init__(self, config: Config, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.env = env
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "cli.main", "serve", "--store", str(self.config.store),
                   "--bind", self.config.address]
        log = self.log
        private_dir(log.parent)  # not a directory another user made first in /tmp
        fd = open_private(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with open(fd, "ab") as out:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=out, env=self.env, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        with Client(self.config.address) as client:
            while not client.ping(timeout=0.5):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise Unreachable(f"the embedded server did not start; its log {log} ends: "
                                      f"{log_tail(log)}", address=self.config.address)

    @property
    def log(self) -> Path:
        return Path(self.config.runtime_dir) / "embedded-server.log"

    def stop(self) -> None:
        """SIGTERM, and SIGKILL after STOP_TIMEOUT; a server killed so first writes every
        thread's and task's stack to its log (`dump_stacks`), which says where it hung."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def dump_stacks(self, timeout: float = 5.0) -> None:
        """Have the server write every thread's and task's stack to its log (SIGUSR1), and
        return once the tasks' are there (written by its loop, if that still turns) or after
        `timeout`."""
        if self.process is None or self.process.poll() is not None:
            return
        start = self.log.stat().st_size
        os.kill(self.process.pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            with open(self.log, "rb") as log:
                log.seek(start)
                if stacks.DUMPED.encode() in log.read():
                    return
            time.sleep(0.05)

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""How short of memory the host is, from the kernel's own signals, with hysteresis.

Where the server runs in a cgroup v2 with a memory limit, what counts is the cgroup: memory in
use is its working set (`memory.current` less the page cache it may drop, `inactive_file`) of
`memory.max`, stalls are its `memory.pressure`, and the kernel throttling it or reclaiming at its
limit shows in `memory.events` (`high`, `max`, `oom`). Elsewhere it is the host: memory in use as
psutil reads it, stalls from `/proc/pressure/memory` (PSI).

Pressure begins when memory in use reaches `enter` percent, tasks stall on memory for `stall`
percent of the time (PSI's "some", over its last 10 s), or the cgroup's events counted another
throttle or reclaim at its limit since the last look; it ends only once memory in use is below
`leave` and stalls below half of `stall`, so that the memory one eviction frees does not end it
only for the next allocation to start it again. A PSI trigger on the same file (`trigger`) makes
the kernel wake the server as soon as stalls pass that share of a 2 s window (`stalled`), which
starts pressure at once, before the 10 s average shows it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
HOST_PSI = Path("/proc/pressure/memory")
RELIEF = 10  # percentage points under the start of pressure where it ends, unless set
TRIGGER_WINDOW = 2_000_000  # microseconds; a multiple of 2 s, which unprivileged triggers need


@dataclass(frozen=True)
class Reading:
    """One look at memory: the share of it in use and of time stalled on it, and where from."""

    used: float  # percent of the host's memory, or of the cgroup's limit, in use
    stall: float | None  # percent of the last 10 s some task stalled on memory; None: no PSI
    source: str  # "cgroup CGROUP" or "host"
    events: int = 0  # the cgroup's throttles and reclaims at its limit so far (memory.events)


def limited_cgroup(root: Path = CGROUP_ROOT, own: Path = Path("/proc/self/cgroup")
                   ) -> Path | None:
    """The cgroup v2 folder this process runs in, if it (or one above it) limits memory."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    folder = root / path.lstrip("/")
    while True:
        limit = _read(folder / "memory.max")
        if limit is not None and limit.strip() != "max":
            return folder
        if folder == root or root not in folder.parents:
            return None
        folder = folder.parent


def psi_some(path: Path) -> float | None:
    """PSI's "some avg10" of `path` (percent of the last 10 s some task stalled); None if the
    kernel offers none."""
    text = _read(path)
    for line in (text or "").splitlines():
        kind, *values = line.split()
        if kind == "some":
            return float(dict(v.split("=", 1) for v in values)["avg10"])
    return None


def cgroup_used(cgroup: Path) -> float | None:
    """Percent of `cgroup`'s memory limit its working set holds; None if it has none now."""
    current, limit = _read(cgroup / "memory.current"), _read(cgroup / "memory.max")
    stat = _read(cgroup / "memory.stat") or ""
    try:
        inactive = next((int(line.split()[1]) for line in stat.splitlines()
                         if line.startswith("inactive_file ")), 0)
        return 100.0 * max(int(current or "") - inactive, 0) / int(limit or "")
    except (ValueError, ZeroDivisionError):  # gone, or "max" since: the host's then
        return None


def cgroup_events(cgroup: Path) -> int:
    """How many times `cgroup` was throttled past `memory.high`, reclaimed at `memory.max` or
    ran out of memory so far (its `memory.events`)."""
    counts = dict(line.split() for line in (_read(cgroup / "memory.events") or "").splitlines()
                  if len(line.split()) == 2)
    return sum(int(counts.get(key, 0)) for key in ("high", "max", "oom"))


class Pressure:
    """Whether memory is short now (`check`), entering at `enter` percent in use (or `stall`
    percent of time stalled) and leaving below `leave` (0: RELIEF points below `enter`) and
    half of `stall`; `stall` 0: stalls are not read."""

    def __init__(self, enter: int, leave: int = 0, stall: int = 0,
                 cgroup: Path | None = None) -> None:
        self.enter, self.leave, self.stall = enter, leave or max(enter - RELIEF, 0), stall
        self.cgroup = cgroup
        self.psi = cgroup / "memory.pressure" if cgroup is not None else HOST_PSI
        self.on = False
        self._stalled = False  # the trigger fired since the last check
        self.last = self.read()  # the latest reading `check` made

    @classmethod
    def here(cls, enter: int, leave: int = 0, stall: int = 0) -> Pressure:
        """Pressure on this process's cgroup if it has a memory limit, else on the host."""
        return cls(enter, leave, stall, limited_cgroup())

    def read(self) -> Reading:
        stall = psi_some(self.psi) if self.stall else None
        if self.cgroup is not None and (used := cgroup_used(self.cgroup)) is not None:
            return Reading(used, stall, f"cgroup {self.cgroup}", cgroup_events(self.cgroup))
        return Reading(psutil.virtual_memory().percent, stall, "host")


    def check(self) -> bool:
        """Read memory and say whether it is short, with hysteresis (see the module's notes)."""
        before, now = self.last, self.read()
        self.last = now
        stall = now.stall if now.stall is not None and self.stall else -1.0
        if self.on:
            self.on = now.used >= self.leave or stall >= self.stall / 2
        else:
            self.on = now.used >= self.enter or stall >= self.stall \
                or now.events > before.events or self._stalled
        self._stalled = False
        return self.on

    def stalled(self) -> None:
        """The kernel's trigger fired: memory is short at the next check."""
        self._stalled = True

    def trigger(self) -> Trigger | None:
        """A PSI trigger that becomes readable when tasks stall on memory for `stall` percent
        of a window; None where the kernel (or this user) cannot have one."""
        if not self.stall:
            return None
        try:
            return Trigger(self.psi, self.stall * TRIGGER_WINDOW // 100)
        except OSError as exc:
            log.info("no memory stall trigger on %s (%s): memory is sampled alone",
                     self.psi, exc)
            return None


class Trigger:
    """The kernel's PSI trigger on `psi`: `fileno` is readable (an epoll of the trigger, which
    the kernel signals with POLLPRI, not the POLLIN an event loop waits for) once tasks stalled
    `threshold` microseconds within TRIGGER_WINDOW."""

    def __init__(self, psi: Path, threshold: int) -> None:
        self._fd = os.open(psi, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.write(self._fd, f"some {max(threshold, 1)} {TRIGGER_WINDOW}\0".encode())
            self._poll = select.epoll()
            self._poll.register(self._fd, select.EPOLLPRI)
        except OSError:
            os.close(self._fd)
            raise

    def fileno(self) -> int:
        return self._poll.fileno()

    def drain(self) -> None:
        """Take the trigger's pending event, if the loop's own look at it has not already."""
        self._poll.poll(0)

    def close(self) -> None:
        self._poll.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None

"""Memory pressure from the kernel's signals: a cgroup v2's limit and PSI, with hysteresis; and
the order in which kept workers leave when it is short."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric.pool.memory import HOST_PSI, Pressure, limited_cgroup, psi_some
from fabric.pool.ranking import Kept, rank

PSI = "some avg10={some:.2f} avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 " \
      "avg300=0.00 total=1\n"


def _cgroup(folder: Path, used: int, stall: float = 0.0, limit: int = 1000, high: int = 0) -> Path:
    """A cgroup v2 folder as the kernel writes it: `used` bytes of `limit` in its working set
    (more in use, the rest page cache it may drop), tasks stalled `stall` percent of 10 s,
    throttled past memory.high `high` times."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.max").write_text(f"{limit}\n")
    (folder / "memory.current").write_text(f"{used + 300}\n")
    (folder / "memory.stat").write_text("anon 1\nfile 400\nactive_file 100\n"
                                        "inactive_file 300\n")
    (folder / "memory.pressure").write_text(PSI.format(some=stall))
    (folder / "memory.events").write_text(f"low 0\nhigh {high}\nmax 0\noom 0\noom_kill 0\n")
    return folder


def test_pressure_begins_at_one_level_and_ends_only_below_a_lower_one(tmp_path: Path) -> None:
    cgroup = _cgroup(tmp_path / "server", 500)
    pressure = Pressure(enter=80, leave=60, stall=20, cgroup=cgroup)
    seen = []
    for used in (500, 850, 700, 610, 590, 700, 790, 800):
        _cgroup(cgroup, used)
        seen.append(pressure.check())
    assert seen == [False, True, True, True, False, False, False, True]
    assert pressure.last.source == f"cgroup {cgroup}"
    assert pressure.last.used == 80.0  # the working set, not the page cache it may drop

    pressure = Pressure(enter=80, leave=60, stall=20, cgroup=cgroup)
    stalls = []
    for stall in (15.0, 25.0, 12.0, 9.0, 15.0):  # well under the limit: stalls alone
        _cgroup(cgroup, 100, stall)
        stalls.append(pressure.check())
    assert stalls == [False, True, True, False, False]

    throttled = []  # the kernel throttling the cgroup past memory.high, well under the limit
    for used, high in ((650, 0), (650, 3), (650, 3), (550, 3)):
        _cgroup(cgroup, used, high=high)
        throttled.append(pressure.check())
    assert throttled == [False, True, True, False]  # 65% holds it on; it ends below 60%

    pressure.stalled()  # the kernel's trigger: before the 10 s average shows the stall
    assert [pressure.check(), pressure.check()] == [True, False]


def test_stalls_are_not_read_when_memory_stall_is_off(tmp_path: Path) -> None:
    cgroup = _cgroup(tmp_path / "server", 100, stall=99.0)
    pressure = Pressure(enter=80, stall=0, cgroup=cgroup)
    assert not pressure.check() and pressure.last.stall is None
    assert pressure.leave == 70  # 10 points under, unless set


def test_the_cgroup_read_is_the_nearest_one_that_limits_memory(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    own = tmp_path / "self-cgroup"
    own.write_text("0::/service/server\n")
    _cgroup(root / "service", 10)
    (root / "service" / "server").mkdir()
    (root / "service" / "server" / "memory.max").write_text("max\n")
    assert limited_cgroup(root, own) == root / "service"
    (root / "service" / "memory.max").write_text("max\n")
    assert limited_cgroup(root, own) is None  # no limit: the host's memory is what counts
    own.write_text("4:memory:/legacy\n")  # cgroup v1 alone
    assert limited_cgroup(root, own) is None


def test_an_unlimited_server_reads_the_hosts_memory_and_its_psi() -> None:
    pressure = Pressure.here(100, 99, 10)
    reading = pressure.read()
    assert reading.source.startswith("cgroup ") or reading.source == "host"
    assert 0 < reading.used < 100
    if HOST_PSI.exists() and pressure.cgroup is None:  # the kernel's PSI, read as a percent
        assert reading.stall is not None and 0 <= reading.stall <= 100
        assert psi_some(HOST_PSI) is not None


def test_the_kernel_arms_a_stall_trigger_where_psi_is_writable() -> None:
    pressure = Pressure.here(90, 0, 10)
    trigger = pressure.trigger()
    if trigger is None:
        pytest.skip("no writable PSI here")
    try:
        assert trigger.fileno() >= 0
        trigger.drain()  # no stall now: nothing pending, nothing blocks
    finally:
        trigger.close()
    assert Pressure.here(90, 0, 0).trigger() is None


def test_kept_workers_leave_least_worth_first_and_pinned_ones_last() -> None:
    kept = [
        Kept("pinned, idle for an hour", idle=3600, drafted=False, rebuild=0.1, pinned=True),
        Kept("pinned, just used", idle=1, drafted=False, rebuild=5.0, pinned=True),
        Kept("being edited, cheap", idle=5, drafted=True, rebuild=0.1, pinned=False),
        Kept("idle a minute, costly", idle=60, drafted=False, rebuild=30.0, pinned=False),
        Kept("idle a minute, cheap", idle=60, drafted=False, rebuild=0.5, pinned=False),
        Kept("idle an hour, costly", idle=3600, drafted=False, rebuild=60.0, pinned=False),
        Kept("a draft hours ago", idle=7200, drafted=True, rebuild=30.0, pinned=False),
    ]
    assert [k.key for k in rank(kept)] == [
        "a draft hours ago", "idle a minute, cheap", "idle an hour, costly",
        "idle a minute, costly", "being edited, cheap",
        "pinned, idle for an hour", "pinned, just used"]

"""The simulator on small workloads whose answers are known."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_traces import random_rows, write_trace

from fabric.fleet import NAMES, Costs, SessionModel, read_trace
from fabric.fleet.fleet import Fleet, Request
from fabric.fleet.results import quantile
from fabric.fleet.sessions import Cell, Session, build_sessions
from fabric.fleet.simulate import simulate


def _sessions(tmp_path: Path, count: int = 120) -> list[Session]:
    trainings = read_trace(write_trace(tmp_path / "t.csv", random_rows(count)))
    return build_sessions(trainings, SessionModel(cells_per_gap=3))


def test_a_pinned_session_holds_its_largest_gang_for_its_whole_span() -> None:
    cells = (Cell(30, 600, 4, True), Cell(120, 5, 4, False), Cell(200, 900, 8, True))
    session = Session(0, 100.0, cells)
    out = simulate([session], "pinned", Costs.default(), fleet=Fleet(boot_s=0.0))
    span = 600 + 120 + 5 + 200 + 900
    assert out.held_gpu_s == pytest.approx(8 * span)
    assert out.busy_gpu_s == pytest.approx(4 * 600 + 4 * 5 + 8 * 900)
    assert out.delays == [0.0, 0.0, 0.0]


def test_other_policies_hold_gpus_only_while_cells_run(tmp_path: Path) -> None:
    cells = (Cell(30, 600, 4, True), Cell(3000, 600, 4, True))
    for name in ("notebookos", "fresh", "llfabric"):
        out = simulate([Session(0, 0.0, cells)], name, Costs.default(), fleet=Fleet(boot_s=0.0))
        assert 4 * 1200 < out.held_gpu_s < 4 * 1300, name  # runs, plus loads, saves, parks


def test_fresh_workers_never_start_cells_sooner_than_drafts(tmp_path: Path) -> None:
    sessions = _sessions(tmp_path)
    costs = Costs.default()
    fresh = sorted(simulate(sessions, "fresh", costs, fleet=Fleet(boot_s=0.0)).delays)
    drafts = sorted(simulate(sessions, "llfabric", costs, fleet=Fleet(boot_s=0.0)).delays)
    assert len(fresh) == len(drafts)
    for q in (0.01, 0.1, 0.5, 0.9, 0.99, 1.0):
        assert quantile(drafts, q) <= quantile(fresh, q)


def test_gangs_are_never_split_nor_a_host_overfilled() -> None:
    fleet = Fleet(boot_s=0.0, spare_gpus=0)
    placed: list[tuple[int, int]] = []
    for gpus in (4, 8, 4, 1, 8, 1, 1, 1, 1, 4):
        fleet.ask(Request(gpus, 0.0, (), lambda host, now, g=gpus: placed.append((host, g))))
        fleet.booted()  # hosts come up at once here (boot_s 0)
    used: dict[int, int] = {}
    for host, gpus in placed:
        used[host] = used.get(host, 0) + gpus
    assert len(placed) == 10 and all(u <= 8 for u in used.values())
    assert all(h.free == 8 - used.get(h.index, 0) for h in fleet.hosts)
    assert len(fleet.hosts) == 5  # 33 GPUs, best fit: 4+4, 8, 1x5, 8, 4


@pytest.mark.parametrize("name", NAMES)
def test_used_never_exceeds_held_nor_held_provisioned(tmp_path: Path, name: str) -> None:
    out = simulate(_sessions(tmp_path), name, Costs.default())
    assert 0 < out.busy_gpu_s <= out.held_gpu_s + 1e-6
    assert out.held_gpu_s <= out.provisioned_gpu_s + 1e-6
    assert all(held <= hosts * 8 for _, hosts, held in out.samples)
    assert len(out.delays) == sum(len(s.cells) for s in _sessions(tmp_path))

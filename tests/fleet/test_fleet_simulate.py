"""The simulator on small workloads whose answers are known."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_traces import random_rows, write_trace

from fabric.fleet import NAMES, Costs, SessionModel, read_trace
from fabric.fleet.fleet import Fleet, GangRequest
from fabric.fleet.results import quantile
from fabric.fleet.sessions import ModelledCell, ModelledSession, build_sessions
from fabric.fleet.simulate import simulate


def _sessions(tmp_path: Path, count: int = 120) -> list[ModelledSession]:
    trainings = read_trace(write_trace(tmp_path / "t.csv", random_rows(count)))
    return build_sessions(trainings, SessionModel(cells_per_gap=3, before_first_h=0.5,
                                                  after_last_h=0.25))


CELLS = (ModelledCell(30, 600, 4, True), ModelledCell(120, 5, 4, False),
         ModelledCell(200, 900, 8, True))
SPAN = 600 + 120 + 5 + 200 + 900


def test_reservation_holds_the_largest_gang_from_open_to_close() -> None:
    session = ModelledSession(0, 7200.0, CELLS, before_s=3600.0, after_s=1800.0)
    out = simulate([session], "reservation", Costs.default(), fleet=Fleet(boot_s=0.0))
    assert out.held_gpu_s == pytest.approx(8 * (3600 + SPAN + 1800))
    assert out.busy_gpu_s == pytest.approx(4 * 600 + 4 * 5 + 8 * 900)
    assert out.delays == [0.0, 0.0, 0.0]
    # the lower bound holds it only from the first cell to the end of the last
    span = simulate([session], "reservation-span", Costs.default(), fleet=Fleet(boot_s=0.0))
    assert span.held_gpu_s == pytest.approx(8 * SPAN)


def test_a_session_open_before_the_trace_began_is_held_from_its_start() -> None:
    session = ModelledSession(0, 600.0, CELLS, before_s=3600.0)
    out = simulate([session], "reservation", Costs.default(), fleet=Fleet(boot_s=0.0))
    assert out.held_gpu_s == pytest.approx(8 * (600 + SPAN))


def test_an_idle_reclaim_holds_until_the_timeout_then_restarts_and_reruns() -> None:
    costs = Costs.default()
    # idle 40 minutes after a training then a small cell: 30 minutes reclaims, 90 does not
    cells = (ModelledCell(30, 600, 4, True), ModelledCell(10, 5, 4, False),
             ModelledCell(2400, 60, 4, True))
    session = ModelledSession(0, 0.0, cells, before_s=0.0, after_s=7200.0)
    out = simulate([session], "reclaim-30m", costs, fleet=Fleet(boot_s=0.0))
    rerun = 600 + 5  # the last training and the cell after it built the state
    assert out.paths == {"pinned": 2, "reclaimed": 1}
    assert out.delays[2] == pytest.approx(costs.restart_s + rerun)
    held = (600 + 10 + 5 + 1800) + (costs.restart_s + rerun + 60 + 1800)  # closed after 30 min
    assert out.held_gpu_s == pytest.approx(4 * held)
    kept = simulate([session], "reclaim-90m", costs, fleet=Fleet(boot_s=0.0))
    assert kept.delays == [0.0, 0.0, 0.0]
    assert kept.held_gpu_s == pytest.approx(4 * (600 + 10 + 5 + 2400 + 60 + 5400))


def test_a_cell_on_no_gpu_holds_none_and_makes_no_cuda_context() -> None:
    cells = (ModelledCell(30, 600, 0, True), ModelledCell(3000, 60, 0, False))
    costs = Costs.default()
    for name in ("notebookos", "fresh", "llfabric"):
        out = simulate([ModelledSession(0, 0.0, cells)], name, costs, fleet=Fleet(boot_s=0.0))
        assert out.held_gpu_s == 0 and out.busy_gpu_s == 0, name
    fresh = simulate([ModelledSession(0, 0.0, cells)], "fresh", costs, fleet=Fleet(boot_s=0.0))
    load = costs.closure_gb / min(costs.load_gbps, costs.peer_gbps)
    assert fresh.delays[0] == pytest.approx(costs.fork_s + load + costs.warm_ready_s)


def test_a_worker_lingers_for_a_quick_next_cell_and_is_parked_otherwise() -> None:
    costs = Costs.default()
    cells = (ModelledCell(30, 600, 8, True), ModelledCell(20, 5, 8, False),
             ModelledCell(3000, 600, 8, True))
    out = simulate([ModelledSession(0, 0.0, cells)], "llfabric", costs, fleet=Fleet(boot_s=0.0))
    assert out.paths["lingered"] == 1 and out.delays[1] == costs.warm_ready_s
    save = costs.save_s(True)
    # 8 GPUs through the first cell and its linger, and the small cell, which lingers 60 s in
    # vain and is parked; the last cell's are given back when the session closes
    expected = 8 * (600 + save + 20) + 8 * (5 + costs.save_s(False) + costs.linger_s
                                            + costs.park_s)
    assert out.held_gpu_s == pytest.approx(expected + 8 * (600 + save), rel=0.01)
    parked = simulate([ModelledSession(0, 0.0, cells)], "llfabric", costs.with_inputs(linger_s=0.0),
                      fleet=Fleet(boot_s=0.0))
    assert "lingered" not in parked.paths and parked.held_gpu_s < out.held_gpu_s
    # a next cell on other GPUs than its worker keeps: it is parked, as the server does
    other = (ModelledCell(30, 600, 8, True), ModelledCell(20, 5, 4, False))
    resized = simulate([ModelledSession(0, 0.0, other)], "llfabric", costs, fleet=Fleet(boot_s=0.0))
    assert "lingered" not in resized.paths


def test_a_request_that_waits_takes_the_gpus_of_a_lingering_worker_once_it_is_parked() -> None:
    costs = Costs.default()
    first = ModelledSession(0, 0.0, (ModelledCell(0, 100, 8, True),
                                     ModelledCell(1000, 10, 8, False)))
    # while the first's worker lingers
    second = ModelledSession(1, 130.0, (ModelledCell(0, 10, 8, False),))
    one_host = Fleet(gpus_per_host=8, spare_gpus=0, boot_s=0.0, max_hosts=1)
    out = simulate([first, second], "llfabric", costs, fleet=one_host)
    assert out.waits[1] == pytest.approx(costs.park_s)  # not the 60 s linger
    assert "lingered" not in out.paths


def test_other_policies_hold_gpus_only_while_cells_run(tmp_path: Path) -> None:
    cells = (ModelledCell(30, 600, 4, True), ModelledCell(3000, 600, 4, True))
    for name in ("notebookos", "fresh", "llfabric"):
        out = simulate([ModelledSession(0, 0.0, cells)], name, Costs.default(),
                       fleet=Fleet(boot_s=0.0))
        assert 4 * 1200 < out.held_gpu_s < 4 * 1400, name  # runs, plus loads, saves, parks


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
        fleet.ask(GangRequest(gpus, 0.0, (), lambda host, now, g=gpus: placed.append((host, g))))
        fleet.booted()  # hosts come up at once here (boot_s 0)
    used: dict[int, int] = {}
    for host, gpus in placed:
        used[host] = used.get(host, 0) + gpus
    assert len(placed) == 10 and all(u <= 8 for u in used.values())
    assert all(h.free == 8 - used.get(h.index, 0) for h in fleet.hosts)
    assert len(fleet.hosts) == 5  # 33 GPUs, best fit: 4+4, 8, 1x5, 8, 4


@pytest.mark.parametrize("name", NAMES)
def test_used_never_exceeds_held_nor_held_provisioned(tmp_path: Path, name: str) -> None:
    sessions = _sessions(tmp_path)
    out = simulate(sessions, name, Costs.default())
    assert 0 < out.busy_gpu_s <= out.held_gpu_s + 1e-6
    assert out.held_gpu_s <= out.provisioned_gpu_s + 1e-6
    assert all(0 <= held <= hosts * 8 for _, hosts, held in out.samples)
    assert len(out.delays) == sum(len(s.cells) for s in sessions)


def test_reservation_holds_at_least_what_any_policy_does(tmp_path: Path) -> None:
    sessions = _sessions(tmp_path)
    held = {name: simulate(sessions, name, Costs.default()).held_gpu_s for name in NAMES}
    assert held["reservation"] >= held["reservation-span"]
    assert held["reservation"] >= held["reclaim-180m"]
    assert all(held["reservation"] > held[n] for n in ("notebookos", "fresh", "llfabric"))

"""The live replay's plan and its simulated twin (the live run itself: `llfabric replay`)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from fabric.errors import TraceError
from fabric.fleet.replay import LiveCell, plan, simulated
from fabric.fleet.sessions import ModelledCell, ModelledSession

TRACE = [ModelledSession(0, 0.0, (ModelledCell(30, 600, 1, True),
                                  ModelledCell(120, 5, 1, False),
                                  ModelledCell(6000, 3000, 1, True)))]


def _notebook(path: Path, cells: int) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"x{i} = {i}") for i in range(cells)]
    nbformat.write(nb, str(path))
    return path


def test_a_plan_runs_each_notebook_with_capped_think_times_and_bursts(tmp_path: Path) -> None:
    notebooks = [_notebook(tmp_path / "a.ipynb", 4), _notebook(tmp_path / "b.ipynb", 2)]
    plans = plan(notebooks, 3, TRACE, compress=60, max_think=1.5, max_burst=2.0, burst_every=2)
    assert [p.notebook for p in plans] == [notebooks[0], notebooks[1], notebooks[0]]
    kinds = [k for _, k, _ in plans[0].cells]
    assert kinds == ["notebook", "notebook", "burst", "notebook", "notebook", "burst"]
    assert all(0 < think <= 1.5 for think, _, _ in plans[0].cells)
    burst = next(s for _, k, s in plans[0].cells if k == "burst")
    assert 0 < float(burst.split("+ ")[1].split("\n")[0]) <= 2.0
    with pytest.raises(TraceError, match="cannot read the notebook"):
        plan([tmp_path / "missing.ipynb"], 1, TRACE, 60, 1, 1, 2)


def _twin(tmp_path: Path, sessions: int) -> dict:
    notebooks = [_notebook(tmp_path / "a.ipynb", 3)]
    plans = plan(notebooks, sessions, TRACE, compress=60, max_think=2.0, max_burst=1.0,
                 burst_every=3)
    cells = [LiveCell(s, kind, think, "ok", "draft", 0.01, 0, 0.1, 0.5, 0.01, 0.52)
             for s, p in enumerate(plans) for think, kind, _ in p.cells]
    return simulated(cells, plans, slots=2)


def test_the_simulated_twin_holds_pinned_slots_longer_than_llfabric(tmp_path: Path) -> None:
    # more sessions than slots: a lingering worker yields its slot to a waiting cell
    twin = _twin(tmp_path, 4)
    assert twin["pinned"]["slot_seconds_held"] > twin["llfabric"]["slot_seconds_held"] > 0
    # a slot each: pinned never waits, and llfabric's workers linger for the next cells
    alone = _twin(tmp_path, 2)
    assert alone["pinned"]["share_under_100ms"] == 1.0
    assert alone["llfabric"]["paths"]["lingered"] > 0

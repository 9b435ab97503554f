"""The trace reader refuses what it cannot trust, by line; the session model cuts and fills
sessions as it says."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_traces import HEADER, write_trace

from fabric.errors import TraceError
from fabric.fleet import SessionModel, read_trace
from fabric.fleet.sessions import build_sessions, runs, without_gpus


def test_a_trace_is_read_in_job_id_order(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "1,4,10,0,vgg16,3,0\n0,1,5,0,vgg16,2,0\n")
    trainings = read_trace(path)
    assert [(t.job_id, t.gpus, t.submit_min, t.duration_min) for t in trainings] == \
        [(0, 1, 5, 2), (1, 4, 10, 3)]


@pytest.mark.parametrize(("body", "says"), [
    ("0,1,5,0,vgg16,2\n", "6 fields"),
    ("0,one,5,0,vgg16,2,0\n", "num_gpu is 'one'"),
    ("0,16,5,0,vgg16,2,0\n", "exceeds a host's 8"),
    ("0,1,5,0,vgg16,0,0\n", "duration is 0"),
    ("0,1,-3,0,vgg16,2,0\n", "submit_time is -3"),
    ("0,1,5,0,vgg16,2,0\n0,1,6,0,vgg16,2,0\n", "appears twice"),
    ("", "no trainings"),
])
def test_a_malformed_trace_is_refused_with_where(tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + body)
    with pytest.raises(TraceError, match=says) as caught:
        read_trace(path)
    assert str(path) in caught.value.message


def test_a_wrong_header_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="header"):
        read_trace(tmp_path / "t.csv")
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.csv")


def test_sessions_break_at_a_drop_of_submit_time_and_at_a_long_gap(tmp_path: Path) -> None:
    trainings = read_trace(write_trace(tmp_path / "t.csv", [
        (1, 100, 10), (1, 115, 5),    # one session
        (4, 50, 10),                  # submit_time drops: a new one
        (4, 70, 10), (4, 400, 10),    # 320 min after the last ended: cut at 120
    ]))
    assert [[t.job_id for t in g] for g in runs(trainings, 120)] == [[0, 1], [2, 3], [4]]
    assert [[t.job_id for t in g] for g in runs(trainings, 1000)] == [[0, 1], [2, 3, 4]]


def test_small_cells_fill_the_gaps_and_think_times_keep_the_trace_s_timing(tmp_path: Path) -> None:
    trainings = read_trace(write_trace(tmp_path / "t.csv", [(4, 0, 10), (8, 30, 5), (8, 30, 5)]))
    model = SessionModel(cells_per_gap=3, no_gpu_share=0.0)
    [session] = build_sessions(trainings, model)
    kinds = [(c.training, c.gpus) for c in session.cells]
    # 3 small cells on the first training's GPUs in the 20-minute gap; none between the two
    # trainings submitted in the same minute unless the jitter leaves them room
    assert kinds[:5] == [(True, 4), (False, 4), (False, 4), (False, 4), (True, 8)]
    assert session.max_gpus == 8
    # run with no delay, the cells keep the trace's timing, except that the two trainings of
    # minute 30 run one after the other: 10 + 20 + 5 + 5 minutes, give or take the seconds
    span = sum(c.think_s + c.run_s for c in session.cells[1:]) + session.cells[0].run_s
    assert 39 * 60 <= span <= 43 * 60
    assert all(c.think_s >= 0 for c in session.cells)


def test_by_default_sessions_break_only_at_drops_and_open_before_their_first_training(
        tmp_path: Path) -> None:
    trainings = read_trace(write_trace(tmp_path / "t.csv", [
        (1, 100, 10), (4, 400, 10),   # 290 idle minutes: still one session
        (4, 50, 10),                  # submit_time drops: a new one
    ]))
    model = SessionModel(before_first_h=2.0, after_last_h=1.0, no_gpu_share=0.0)
    sessions = build_sessions(trainings, model)
    assert [s.max_gpus for s in sessions] == [4, 4]
    assert all((s.before_s, s.after_s) == (7200.0, 3600.0) for s in sessions)


def test_trainings_on_no_gpu_are_drawn_among_one_gpu_rows(tmp_path: Path) -> None:
    rows = [(1, k, 5) for k in range(0, 2000, 10)] + [(8, k, 5) for k in range(0, 2000, 10)]
    trainings = without_gpus(read_trace(write_trace(tmp_path / "t.csv", rows)), 0.25, seed=0)
    gpus = [t.gpus for t in trainings]
    assert 0.2 < gpus.count(0) / len(gpus) < 0.3
    assert gpus.count(8) == 200

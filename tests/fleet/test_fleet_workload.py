"""A session-level workload (NotebookOS's workload-template JSON) is read into sessions whose open
and close it gives; a malformed one is refused with the line and field that are wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import main
from fabric.errors import TraceError
from fabric.fleet import SessionModel
from fabric.fleet.sessions import workload_sessions
from fabric.fleet.workload import read_workload


def _training(start: int, ticks: int, gpus: int) -> dict:
    return {"start_tick": start, "duration_in_ticks": ticks, "gpus": gpus, "vram": 2.5,
            "cpus": 400, "memory": 1024}


GOOD = {"sessions": [
    {"id": "a", "start_tick": 0, "stop_tick": 200,
     "trainings": [_training(30, 10, 2), _training(60, 20, 4)]},
    {"id": "b", "start_tick": 10, "stop_tick": 50, "trainings": [_training(10, 5, 0)]},
]}


def _write(path: Path, data: dict) -> Path:
    """One session's own fields a line, then each training a line: session 0 on line 2, its
    trainings on 3 and 4; session 1 on line 6, its training on 7."""
    lines = ['{"sessions": [']
    for k, session in enumerate(data["sessions"]):
        head = {key: v for key, v in session.items() if key != "trainings"}
        lines.append(json.dumps(head)[:-1] + ', "trainings": [')
        trainings = session.get("trainings", [])
        lines += [json.dumps(t) + ("," if i < len(trainings) - 1 else "")
                  for i, t in enumerate(trainings)]
        lines.append("]}" + ("," if k < len(data["sessions"]) - 1 else ""))
    path.write_text("\n".join([*lines, "]}"]))
    return path


def test_a_workload_gives_each_session_its_open_and_close(tmp_path: Path) -> None:
    workload = read_workload(_write(tmp_path / "w.json", GOOD))
    assert [(o, c, [(t.gpus, t.submit_min, t.duration_min) for t in ts])
            for o, c, ts in workload] == [(0, 200, [(2, 30, 10), (4, 60, 20)]),
                                          (10, 50, [(0, 10, 5)])]
    first, second = workload_sessions(workload, SessionModel())
    assert first.max_gpus == 0 and second.max_gpus == 4  # ordered by first execute
    # open 30 minutes before its first training (and the seconds the model adds under its
    # minute), closed 120 after its last ended
    assert 30 * 60 <= second.before_s <= 31 * 60 and second.after_s == 120 * 60


@pytest.mark.parametrize(("edit", "line", "says"), [
    (lambda d: d["sessions"][1]["trainings"][0].update(gpus="2"), 7,
     'sessions[1].trainings[0].gpus is "2", not an integer'),
    (lambda d: d["sessions"][0]["trainings"][1].pop("duration_in_ticks"), 4,
     "sessions[0].trainings[1].duration_in_ticks is missing"),
    (lambda d: d["sessions"][0]["trainings"][0].update(gpus=16), 3,
     "gpus is 16, more than a host's 8"),
    (lambda d: d["sessions"][0].update(stop_tick=70), 4, "runs ticks 60-80, outside its "
     "session's 0-70"),
    (lambda d: d["sessions"][0].update(trainings=[]), 2, "sessions[0].trainings must be a list"),
    (lambda d: d["sessions"][1].update(start_tick=-1), 6, "sessions[1].start_tick is -1"),
    (lambda d: d["sessions"][0]["trainings"].append(3), 2, "trainings[2] is 3, not an object"),
])
def test_a_malformed_workload_is_refused_with_line_and_field(tmp_path: Path, edit, line: int,
                                                             says: str) -> None:
    data = json.loads(json.dumps(GOOD))
    edit(data)
    path = _write(tmp_path / "bad.json", data)
    with pytest.raises(TraceError) as caught:
        read_workload(path)
    assert says in caught.value.message
    assert f"{path}:" in caught.value.message
    assert caught.value.message.startswith(f"{path}:{line}:"), caught.value.message


def test_a_file_that_is_not_a_workload_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.json").write_text('{"sessions": [\n  {"start_tick": 0,,}\n]}')
    with pytest.raises(TraceError, match=r"w.json:2: not JSON"):
        read_workload(tmp_path / "w.json")
    (tmp_path / "w.json").write_text('{"session": []}')
    with pytest.raises(TraceError, match="sessions must be a list"):
        read_workload(tmp_path / "w.json")
    with pytest.raises(TraceError, match="cannot read the workload"):
        read_workload(tmp_path / "missing.json")


def test_simulate_runs_a_workload_and_names_a_bad_one(tmp_path: Path) -> None:
    path = _write(tmp_path / "w.json", GOOD)
    runner = CliRunner()
    done = runner.invoke(main, ["simulate", str(tmp_path / "run"), "--workload", str(path)])
    assert done.exit_code == 0, done.output
    assert "reservation" in done.output and "llfabric" in done.output
    data = json.loads(json.dumps(GOOD))
    data["sessions"][0]["trainings"][0]["gpus"] = 1.5
    done = runner.invoke(main, ["simulate", str(tmp_path / "run2"), "--workload",
                                str(_write(tmp_path / "bad.json", data))])
    assert done.exit_code == 1 and "trainings[0].gpus is 1.5, not an integer" in done.output

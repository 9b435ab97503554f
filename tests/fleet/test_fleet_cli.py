"""`llfabric simulate` and `report` end to end on a small trace; a bad trace is a clear error."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from fleet_traces import HEADER, random_rows, write_trace

from cli.main import main


def test_simulate_prints_the_headline_and_report_writes_the_page(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", random_rows(40))
    runner = CliRunner()
    done = runner.invoke(main, ["simulate", str(tmp_path / "run"), "--trace", str(trace)])
    assert done.exit_code == 0, done.output
    assert all(name in done.output for name in ("reservation", "notebookos", "fresh", "llfabric"))
    assert "cells < 100 ms" in done.output
    done = runner.invoke(main, ["report", str(tmp_path / "run")])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "run" / "report.html").stat().st_size > 0


def test_a_malformed_trace_ends_simulate_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(HEADER + "0,1,5,0,vgg16,2,0\n1,2,x,0,vgg16,2,0\n")
    done = CliRunner().invoke(main, ["simulate", str(tmp_path / "run"),
                                     "--trace", str(tmp_path / "t.csv")])
    assert done.exit_code == 1
    assert "t.csv:3: submit_time is 'x'" in done.output

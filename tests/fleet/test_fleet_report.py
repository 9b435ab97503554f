"""A run directory: resumed, refused when it holds another run; its report is one page with its
images inside, and JSON that reads back as the same figures."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fleet_traces import random_rows, write_trace

from fabric.errors import TraceError
from fabric.fleet import Costs, SessionModel, simulate_run, write_report
from fabric.fleet.report import load_figures


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.sources.append(dict(attrs)["src"] or "")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    trace = write_trace(root / "t.csv", random_rows(60))
    simulate_run(trace, root / "run", SessionModel(), Costs.default())
    return root / "run"


def test_the_report_is_one_page_with_its_plots_inside(run_dir: Path) -> None:
    page = write_report(run_dir)
    parser = _Images()
    parser.feed(page.read_text())
    assert len(parser.sources) >= 3
    for source in parser.sources:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert all(name in text for name in ("reservation", "notebookos", "fresh", "llfabric"))
    assert "measured" in text and "modelled" in text


def test_the_figures_json_reads_back_as_the_figures(run_dir: Path) -> None:
    write_report(run_dir)
    figures = json.loads((run_dir / "figures.json").read_text())
    assert figures == json.loads(json.dumps(load_figures(run_dir)))
    reservation = figures["policies"]["reservation"]
    assert reservation["saved_vs_reservation_pct"] == 0
    assert reservation["cells"] == figures["run"]["cells"]


def test_a_finished_policy_is_not_simulated_again(run_dir: Path) -> None:
    trace = Path(json.loads((run_dir / "run.json").read_text())["trace"]["path"])
    done = run_dir / "policies" / "llfabric.json"
    done.write_text(json.dumps({**json.loads(done.read_text()), "marker": 1}))
    figures = simulate_run(trace, run_dir, SessionModel(), Costs.default())
    assert figures["llfabric"]["marker"] == 1


def test_a_directory_of_another_run_is_refused(run_dir: Path) -> None:
    trace = Path(json.loads((run_dir / "run.json").read_text())["trace"]["path"])
    with pytest.raises(TraceError, match="another run"):
        simulate_run(trace, run_dir, SessionModel(split_gap_min=5), Costs.default())


def test_a_report_needs_a_run(tmp_path: Path, run_dir: Path) -> None:
    with pytest.raises(TraceError, match="not a simulation run"):
        write_report(tmp_path)
    broken = tmp_path / "broken"
    (broken / "policies").mkdir(parents=True)
    (broken / "run.json").write_text((run_dir / "run.json").read_text())
    (broken / "policies" / "reservation.json").write_text("{not json")
    with pytest.raises(TraceError, match="not JSON"):
        write_report(broken)


def test_a_replay_beside_the_run_is_reported_and_a_foreign_one_refused(run_dir: Path) -> None:
    row = {"slot_seconds_held": 10.0, "share_under_100ms": 0.5, "delay_p50_s": 0.01}
    replay = {"sessions": 2, "slots": 1, "compress": 60, "notebooks": ["a.ipynb"],
              "live_llfabric": row, "live_pinned": row,
              "simulated": {"llfabric": row, "pinned": row}}
    path = run_dir / "replay.json"
    path.write_text(json.dumps(replay))
    try:
        text = write_report(run_dir).read_text()
        assert "simulated pinned" in text and "live llfabric" in text
        path.write_text(json.dumps({"sessions": 2}))
        with pytest.raises(TraceError, match="not a replay"):
            write_report(run_dir)
    finally:
        path.unlink()


def test_the_sweep_varies_each_input_and_is_plotted(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", random_rows(30))
    simulate_run(trace, tmp_path / "run", SessionModel(), Costs.default(),
                 policies=("reservation", "llfabric"), sweep=True)
    rows = json.loads((tmp_path / "run" / "sweep.json").read_text())["rows"]
    shorter = next(r for r in rows if (r["parameter"], r["value"]) == ("before_first_h", 0.0))
    longer = next(r for r in rows if (r["parameter"], r["value"]) == ("before_first_h", 12.0))
    assert (shorter["policies"]["reservation"]["gpu_hours_held"]
            < longer["policies"]["reservation"]["gpu_hours_held"])
    text = write_report(tmp_path / "run").read_text()
    assert "Swept: before_first_h" in text and "Swept: linger_s" in text

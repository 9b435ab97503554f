"""`llfabric simulate`, `report` and `replay`: the fleet simulation over a trace, its page, and
a small workload live."""

from __future__ import annotations

from pathlib import Path

import click

from fabric.fleet.policies import NAMES as POLICY_NAMES

from .common import DEMO_NOTEBOOK

TRACE = (Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
         / "sensei_june_60sec.csv")
_ROOT = Path(__file__).resolve().parent.parent
# small notebooks of the corpus: torch modules, numpy basics, plain Python
DEFAULT_NOTEBOOKS = [_ROOT / "corpus" / "d2l-pytorch" / "ch07_Custom_Layers.ipynb",
                     _ROOT / "corpus" / "pydata-book" / "ch02.ipynb",
                     DEMO_NOTEBOOK]


class _Bars:
    """One tqdm bar per policy (and sweep variant), in simulated hours, with its ETA."""

    def __init__(self) -> None:
        self.label, self.bar = "", None

    def __call__(self, label: str, now: float, horizon: float) -> None:
        from tqdm import tqdm

        bar = self.bar
        if label != self.label or bar is None:
            self.close()
            self.label = label
            bar = self.bar = tqdm(total=round(horizon / 3600), desc=label, unit="h simulated")
        bar.update(round(now / 3600) - bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--trace", type=click.Path(path_type=Path, dir_okay=False), default=TRACE,
              show_default=True, help="Training trace (Tiresias job-list CSV).")
@click.option("--workload", type=click.Path(path_type=Path, dir_okay=False),
              help="A session-level workload (NotebookOS's workload-template JSON) instead of "
                   "the trace.")
@click.option("--policy", "policies", multiple=True, type=click.Choice(POLICY_NAMES),
              help="Simulate only these (default: all).")
@click.option("--split-gap-min", type=float, default=None,
              help="Also cut a session where the next training starts this long after the last "
                   "ended (default: cut at drops of submit_time only).")
@click.option("--cells-per-gap", type=int, default=3, show_default=True,
              help="Short non-training cells modelled between two trainings.")
@click.option("--sweep", is_flag=True,
              help="Also rerun with each session-shape and cost input varied alone.")
def simulate(run_dir: Path, trace: Path, workload: Path | None, policies: tuple[str, ...],
             split_gap_min: float | None, cells_per_gap: int, sweep: bool) -> None:
    """Simulate the trace's month under each policy into RUN_DIR (resumes an interrupted run)."""
    from fabric.fleet import NAMES, Costs, SessionModel, headline_table, simulate_run
    from fabric.fleet.costs import RESERVATION_FIT
    from fabric.fleet.report import load_figures

    model = SessionModel(split_gap_min=split_gap_min, cells_per_gap=cells_per_gap)
    bars = _Bars()
    try:
        simulate_run(workload or trace, run_dir, model, Costs.default(), policies or NAMES, sweep,
                     bars, workload=workload is not None)
    finally:
        bars.close()
    figures = load_figures(run_dir)
    click.echo(headline_table(figures))
    reservation = figures["policies"].get("reservation")
    if reservation and workload is None and model == SessionModel(cells_per_gap=cells_per_gap):
        click.echo("reservation fitted: " + RESERVATION_FIT.format(
            utilization=reservation["busy_of_held"]))


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
def report(run_dir: Path) -> None:
    """Write RUN_DIR/report.html (plots embedded) and RUN_DIR/figures.json."""
    from fabric.fleet import write_report

    click.echo(f"wrote {write_report(run_dir)} and {run_dir / 'figures.json'}")


@click.command()
@click.argument("out", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--notebook", "notebooks", multiple=True,
              type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Notebooks whose cells the sessions run, in turn (default: three small ones).")
@click.option("--sessions", type=int, default=8, show_default=True,
              help="Sessions replayed at once, their cells from the notebooks in turn.")
@click.option("--slots", type=int, default=2, show_default=True, help="The server's slots.")
@click.option("--compress", type=float, default=60.0, show_default=True,
              help="The trace's think times and bursts are divided by this.")
@click.option("--max-think", type=float, default=4.0, show_default=True,
              help="Longest think time, in seconds after compression.")
@click.option("--max-burst", type=float, default=3.0, show_default=True,
              help="Longest training burst, in seconds after compression.")
@click.option("--trace", type=click.Path(path_type=Path, dir_okay=False), default=TRACE,
              show_default=True, help="Training trace (Tiresias job-list CSV) whose think times "
              "and bursts the sessions follow.")
def replay(out: Path, notebooks: tuple[Path, ...], sessions: int, slots: int, compress: float,
           max_think: float, max_burst: float, trace: Path) -> None:
    """Run notebook sessions live on a local server, then pinned, and simulate the same
    workload; write every cell and figure to OUT (JSON; RUN_DIR/replay.json joins the report)."""
    import json

    from fabric.fleet import SessionModel, read_trace
    from fabric.fleet.replay import plan
    from fabric.fleet.replay import replay as run_replay
    from fabric.fleet.sessions import build_sessions

    trace_sessions = build_sessions(read_trace(trace), SessionModel())
    plans = plan(list(notebooks) or DEFAULT_NOTEBOOKS, sessions, trace_sessions, compress,
                 max_think, max_burst, burst_every=3)
    result = run_replay(plans, slots)
    result["compress"] = compress
    out.write_text(json.dumps(result, indent=1))
    for mode in ("live_llfabric", "live_pinned"):
        r = result[mode]
        click.echo(f"{mode:<14} {r['ok']}/{r['cells']} cells ok, slot-s held "
                   f"{r['slot_seconds_held']:.1f} (busy {r['slot_seconds_busy']:.1f}), "
                   f"< 100 ms {r['share_under_100ms']:.0%}, p50 {r['delay_p50_s']:.3f} s, "
                   f"wall {r['wall_s']:.0f} s, paths {r['paths']}")
    for name, r in result["simulated"].items():
        click.echo(f"simulated {name:<9} slot-s held {r['slot_seconds_held']:.1f}, "
                   f"< 100 ms {r['share_under_100ms']:.0%}, p50 {r['delay_p50_s']:.3f} s")

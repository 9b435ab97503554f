"""`llfabric simulate` and `llfabric report`: the fleet simulation over a trace, and its page."""

from __future__ import annotations

from pathlib import Path

import click

TRACE = (Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
         / "sensei_june_60sec.csv")


class _Bars:
    """One tqdm bar per policy (and sweep variant), in simulated hours, with its ETA."""

    def __init__(self) -> None:
        self.label, self.bar = "", None

    def __call__(self, label: str, now: float, horizon: float) -> None:
        from tqdm import tqdm

        if label != self.label:
            self.close()
            self.label = label
            self.bar = tqdm(total=round(horizon / 3600), desc=label, unit="h simulated")
        self.bar.update(round(now / 3600) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--trace", type=click.Path(path_type=Path, dir_okay=False), default=TRACE,
              show_default=True, help="Training trace (Tiresias job-list CSV).")
@click.option("--policy", "policies", multiple=True,
              type=click.Choice(["pinned", "notebookos", "fresh", "llfabric"]),
              help="Simulate only these (default: all).")
@click.option("--split-gap-min", type=float, default=120.0, show_default=True,
              help="Cut a session where the next training starts this long after the last.")
@click.option("--cells-per-gap", type=int, default=3, show_default=True,
              help="Short non-training cells modelled between two trainings.")
@click.option("--sweep", is_flag=True, help="Also run the session model's sensitivity sweep.")
def simulate(run_dir: Path, trace: Path, policies: tuple[str, ...], split_gap_min: float,
             cells_per_gap: int, sweep: bool) -> None:
    """Simulate the trace's month under each policy into RUN_DIR (resumes an interrupted run)."""
    from fabric.fleet import NAMES, Costs, SessionModel, headline_table, simulate_run
    from fabric.fleet.report import load_figures

    model = SessionModel(split_gap_min=split_gap_min, cells_per_gap=cells_per_gap)
    bars = _Bars()
    try:
        simulate_run(trace, run_dir, model, Costs.default(), policies or NAMES, sweep, bars)
    finally:
        bars.close()
    click.echo(headline_table(load_figures(run_dir)))


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
def report(run_dir: Path) -> None:
    """Write RUN_DIR/report.html (plots embedded) and RUN_DIR/figures.json."""
    from fabric.fleet import write_report

    click.echo(f"wrote {write_report(run_dir)} and {run_dir / 'figures.json'}")

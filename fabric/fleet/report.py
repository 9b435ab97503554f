"""`llfabric report RUN_DIR`: one self-contained HTML page of a run's figures, and the same
figures as JSON (RUN_DIR/report.html, RUN_DIR/figures.json).

The plots are matplotlib PNGs embedded as base64, so the page needs nothing beside it.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from fabric.errors import TraceError

from . import sessions
from .policies import NAMES, describe
from .results import Json, compare
from .run import SWEEP, read_json

COLUMNS = (("gpu_hours_provisioned", "GPU-h provisioned", "{:,.0f}"),
           ("gpu_hours_held", "GPU-h held", "{:,.0f}"),
           ("gpu_hours_busy", "GPU-h busy", "{:,.0f}"),
           ("busy_of_held", "busy/held", "{:.1%}"),
           ("busy_of_provisioned", "busy/provisioned", "{:.1%}"),
           ("saved_vs_reservation_pct", "saved vs reservation %", "{:.1f}"),
           ("saved_vs_notebookos_pct", "saved vs NotebookOS %", "{:.1f}"),
           ("saved_per_17h5", "GPU-h saved per 17.5 h", "{:,.0f}"),
           ("cells", "cells", "{:,}"),
           ("share_under_100ms", "cells < 100 ms", "{:.1%}"),
           ("delay_p50_s", "delay p50 s", "{:.3f}"),
           ("delay_p99_s", "delay p99 s", "{:.2f}"),
           ("wait_share", "cells that queued", "{:.2%}"),
           ("wait_p99_s", "queue wait p99 s", "{:.2f}"),
           ("peak_hosts", "peak hosts", "{}"),
           ("mean_hosts", "mean hosts", "{:.1f}"))


def load_figures(run_dir: Path) -> Json:
    """The run's description, every finished policy's figures with its savings, and the sweep:
    what the page shows, checked to be there."""
    run_dir = Path(run_dir)
    if not (run_dir / "run.json").is_file():
        raise TraceError(f"{run_dir} is not a simulation run (no run.json): run `llfabric "
                         "simulate` into it first", path=str(run_dir))
    run = read_json(run_dir / "run.json")
    policies = {}
    for name in NAMES:
        path = run_dir / "policies" / f"{name}.json"
        if path.is_file():
            policies[name] = read_json(path)
    if not policies:
        raise TraceError(f"{run_dir} has no finished policy yet", path=str(run_dir))
    for name, figs in policies.items():
        missing = {c for c, _, _ in COLUMNS if not c.startswith("saved")} - set(figs)
        if missing:
            raise TraceError(f"{run_dir}/policies/{name}.json lacks {sorted(missing)}",
                             path=str(run_dir))
    for name, saved in compare(policies, run["trace"]["hours"]).items():
        policies[name].update(saved)
    sweep = read_json(run_dir / "sweep.json")["rows"] if (run_dir / "sweep.json").is_file() else []
    replay = _replay(run_dir / "replay.json") if (run_dir / "replay.json").is_file() else None
    return {"run": run, "policies": policies, "sweep": sweep, "replay": replay}


def _replay(path: Path) -> dict:
    """A live replay's figures beside the simulator's on its workload (not its cells)."""
    data = read_json(path)
    try:
        rows = {f"live {m}": data[f"live_{m}"] for m in ("llfabric", "pinned")}
        rows.update({f"simulated {m}": data["simulated"][m] for m in ("llfabric", "pinned")})
        return {"sessions": data["sessions"], "slots": data["slots"],
                "compress": data.get("compress"), "notebooks": data["notebooks"],
                "rows": {name: {k: row[k] for k in ("slot_seconds_held", "share_under_100ms",
                                                    "delay_p50_s")} for name, row in rows.items()}}
    except (KeyError, TypeError) as exc:
        raise TraceError(f"{path} is not a replay's output (no {exc})", path=str(path)) from exc


def headline_table(figures: dict) -> str:
    """The headline figures of every policy as a plain-text table."""
    keys = ("gpu_hours_provisioned", "gpu_hours_held", "gpu_hours_busy", "busy_of_held",
            "saved_vs_reservation_pct", "saved_vs_notebookos_pct", "saved_per_17h5",
            "share_under_100ms", "delay_p50_s", "delay_p99_s")
    rows = [["policy"] + [label for key, label, _ in COLUMNS if key in keys]]
    for name, figs in figures["policies"].items():
        rows.append([name] + [fmt.format(figs[key]) if key in figs else "-"
                              for key, _, fmt in COLUMNS if key in keys])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def _plots(figures: dict) -> list[tuple[str, str]]:
    """(title, base64 PNG) of each plot."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    policies = figures["policies"]
    plots = []
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(policies)
    for offset, (key, label) in enumerate((("gpu_hours_provisioned", "provisioned"),
                                           ("gpu_hours_held", "held"),
                                           ("gpu_hours_busy", "busy"))):
        ax.bar([i + 0.27 * (offset - 1) for i in range(len(names))],
               [policies[n][key] for n in names], width=0.27, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("GPU-hours")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the bars, which fill the plot
    plots.append(("GPU-hours by policy", _png(fig)))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name in names:
        cdf = policies[name]["delay_cdf"]
        ax.plot([max(d, 1e-4) for d, _ in cdf], [s for _, s in cdf], label=name)
    ax.axvline(0.1, color="grey", linestyle=":", label="100 ms")
    ax.set_xscale("log")
    ax.set_xlabel("visible delay, s (0 drawn at 0.1 ms)")
    ax.set_ylabel("share of cells")
    ax.legend()
    plots.append(("Visible delay per cell (CDF)", _png(fig)))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name in names:
        samples = policies[name]["hosts_over_time"]
        ax.plot([t / 86400 for t, _, _ in samples], [n for _, n, _ in samples], label=name,
                linewidth=0.8)
    ax.set_xlabel("day of the trace")
    ax.set_ylabel("hosts up")
    ax.legend()
    plots.append(("Hosts over time", _png(fig)))
    plt.close(fig)

    plots += _sweep_plots(figures, plt)

    leases = {n: policies[n].get("leases", {}) for n in names}
    if any(leases.values()):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        row = 0
        labels = []
        for name in names:
            for session, spans in sorted(leases[name].items()):
                first = spans[0][0]  # each session from its own first lease, to compare policies
                ax.broken_barh([((s - first) / 60, (e - s) / 60) for s, e in spans], (row, 0.8))
                labels.append(f"{name} #{session}")
                row += 1
        ax.set_yticks([i + 0.4 for i in range(row)], labels, fontsize=7)
        ax.set_xlabel("minutes since the session's first lease (its first 30 leases)")
        plots.append(("Lease timelines of the busiest sessions", _png(fig)))
        plt.close(fig)
    return plots


def _default(run: dict, parameter: str) -> float | None:
    """The value a swept parameter has in the run itself."""
    if parameter in run["inputs"]:
        return run["inputs"][parameter]["value"]
    return run["model"].get(parameter)


def _sweep_plots(figures: dict, plt) -> list[tuple[str, str]]:
    """For each swept input: GPU-hours provisioned and cells under 100 ms of each policy, at
    the run's own value and at each swept one."""
    plots = []
    for parameter, _ in SWEEP:
        rows = [r for r in figures["sweep"] if r["parameter"] == parameter]
        if not rows:
            continue
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3))
        for name in rows[0]["policies"]:
            points = [(r["value"], r["policies"][name]) for r in rows]
            default = _default(figures["run"], parameter)
            if default is not None and name in figures["policies"]:
                points.append((default, figures["policies"][name]))
            points.sort(key=lambda p: p[0])
            xs = [x for x, _ in points]
            left.plot(xs, [f["gpu_hours_provisioned"] for _, f in points], marker="o", label=name)
            right.plot(xs, [f["share_under_100ms"] for _, f in points], marker="o", label=name)
        left.set_xlabel(parameter)
        left.set_ylabel("GPU-hours provisioned")
        right.set_xlabel(parameter)
        right.set_ylabel("cells under 100 ms")
        right.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
        plots.append((f"Swept: {parameter}", _png(fig)))
        plt.close(fig)
    return plots


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(figures: dict, plots: list[tuple[str, str]]) -> str:
    run, policies = figures["run"], figures["policies"]
    figure_rows = [[name] + [fmt.format(figs[key]) if key in figs else "-"
                             for key, _, fmt in COLUMNS] for name, figs in policies.items()]
    path_rows = [[name, ", ".join(f"{p} {n:,}" for p, n in figs["paths"].items())]
                 for name, figs in policies.items()]
    input_rows = [[name, f"{i['value']:g} {i['unit']}", "measured" if i["measured"] else
                   "modelled", i["source"]] for name, i in run["inputs"].items()]
    sweep_rows = [[f"{r['parameter']} = {r['value']:g}", str(r["sessions"]), name,
                   f"{f['gpu_hours_provisioned']:,.0f}",
                   f"{f.get('saved_vs_reservation_pct', 0):.1f}",
                   f"{f['share_under_100ms']:.1%}", f"{f['delay_p50_s']:.3f}",
                   f"{f['delay_p99_s']:.2f}"]
                  for r in figures["sweep"] for name, f in r["policies"].items()]
    replay = figures.get("replay")
    replay_html = "<p>None in this directory (llfabric replay RUN_DIR/replay.json).</p>"
    if replay:
        replay_html = (f"<p>{replay['sessions']} sessions on {replay['slots']} slots, think times "
                       f"and bursts divided by {replay['compress']}, notebooks "
                       f"{html.escape(', '.join(replay['notebooks']))}.</p>" + _table(
                           ["run", "slot-seconds held", "cells < 100 ms", "delay p50 s"],
                           [[name, f"{r['slot_seconds_held']:.1f}",
                             f"{r['share_under_100ms']:.1%}", f"{r['delay_p50_s']:.3f}"]
                            for name, r in replay["rows"].items()]))
    images = "".join(f"<h2>{html.escape(t)}</h2><img alt='{html.escape(t)}' "
                     f"src='data:image/png;base64,{b}'>" for t, b in plots)
    trace = run["trace"]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>llfabric fleet simulation</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px}}
img{{max-width:100%}}</style></head><body>
<h1>Fleet simulation</h1>
<p>Trace {html.escape(trace['path'])} (sha256 {trace['sha256'][:16]}..., {trace['trainings']:,}
trainings) as {run['sessions']:,} sessions and {run['cells']:,} cells; session model
{html.escape(json.dumps(run['model']))}.</p>
<h2>Every figure</h2>{_table(['policy'] + [label for _, label, _ in COLUMNS], figure_rows)}
<h2>How cells started</h2>{_table(['policy', 'paths'], path_rows)}
<h2>Policies</h2>{_table(['policy', 'model'], [[n, d] for n, d in describe().items()])}
{images}
<h2>Live replay and the simulator on the same workload</h2>{replay_html}
<h2>Session model</h2><pre>{html.escape(sessions.__doc__ or '')}</pre>
<h2>Sensitivity sweep (one parameter varied at a time)</h2>
{_table(['variant', 'sessions', 'policy', 'GPU-h provisioned', 'saved vs reservation %',
         'cells < 100 ms', 'delay p50 s', 'delay p99 s'], sweep_rows) if sweep_rows else
 '<p>Not run (llfabric simulate --sweep).</p>'}
<h2>Inputs</h2>{_table(['input', 'value', 'kind', 'source'], input_rows)}
</body></html>
"""


def write_report(run_dir: Path) -> Path:
    """Write RUN_DIR/report.html and RUN_DIR/figures.json; returns the page's path."""
    run_dir = Path(run_dir)
    figures = load_figures(run_dir)
    (run_dir / "figures.json").write_text(json.dumps(figures, indent=1))
    page = run_dir / "report.html"
    page.write_text(_page(figures, _plots(figures)))
    return page

"""Closure sizes, precision and analysis cost on the dev corpus, cell by cell.

Each notebook is audited in a fresh interpreter (`fabric.audit`): before each cell, the closure
the server would compute from the live session; during it, the session variables the cell
actually looked up (an instrumented namespace: the ground truth). Printed, over every cell that
runs on a non-empty session:

  - state closure vs whole session (what a fresh worker would load without closure analysis),
    in variables and in bytes (estimated in memory): medians and p90 of the per-cell ratio;
  - import closure size (modules a zygote must have imported);
  - cost: static analysis of the finished cell and of its half-typed drafts, the server's closure
    computation, and the worker's grouping walk (median, p99);
  - precision: of the bytes in closures, the share in groups the cell actually touched;
  - recall: misses (looked up, but not in the closure). Must be zero.

Usage: python bench/closure.py [NOTEBOOK ...] [--json OUT]   (default: the whole dev corpus)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from fabric.audit import audit_notebook

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from notebook_compare import notebook_env  # noqa: E402 - the corpus tests' environment

CORPUS = REPO.parent / "shared" / "corpus" / "notebooks"
if not CORPUS.is_dir():
    CORPUS = REPO / "shared" / "corpus" / "notebooks"


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):.{digits}f}, {quantile(values, 0.9):.{digits}f}"


def audit_all(notebooks: list[Path], workdir: Path) -> dict[str, list[dict]]:
    results = {}
    for notebook in notebooks:
        name = f"{notebook.parent.name}/{notebook.stem}"
        start = time.perf_counter()
        try:
            results[name] = audit_notebook(notebook, workdir, env=notebook_env(),
                                           log=workdir / "audit.log")
        except Exception as exc:  # one broken notebook must not hide the others' numbers
            print(f"{name}: audit failed: {exc}", file=sys.stderr)
            continue
        cells = results[name]
        print(f"{name}: {len(cells)} cells, {time.perf_counter() - start:.0f} s, "
              f"{sum(len(c['misses']) for c in cells)} misses", file=sys.stderr, flush=True)
    return results


def summarise(results: dict[str, list[dict]]) -> list[tuple[str, str]]:
    cells = [c for audits in results.values() for c in audits]
    live = [c for c in cells if c["session_variables"]]
    sized = [c for c in live if c["session_bytes"]]
    var_ratio = [c["closure_variables"] / c["session_variables"] for c in live]
    byte_ratio = [c["closure_bytes"] / c["session_bytes"] for c in sized]
    loaded = [c for c in live if c["closure_bytes"]]
    precision_cells = [c["touched_bytes"] / c["closure_bytes"] for c in loaded]
    total_closure = sum(c["closure_bytes"] for c in live)
    total_session = sum(c["session_bytes"] for c in sized)
    misses = [(n, c["index"], m) for n, a in results.items() for c in a for m in c["misses"]]
    ms = 1000.0

    def times(key: str) -> str:
        values = [c[key] * ms for c in cells]
        return f"{statistics.median(values):.2f} / {quantile(values, 0.99):.2f}"

    rows = [
        ("notebooks / code cells / cells on a live session",
         f"{len(results)} / {len(cells)} / {len(live)}"),
        ("session variables: median, p90", spread([c["session_variables"] for c in live])),
        ("closure variables: median, p90", spread([c["closure_variables"] for c in live])),
        ("closure / session, variables: median, p90", spread(var_ratio, digits=3)),
        ("session MB: median, p90", spread([c["session_bytes"] / 1e6 for c in sized], 2)),
        ("closure MB: median, p90", spread([c["closure_bytes"] / 1e6 for c in sized], 2)),
        ("closure / session, bytes: median, p90", spread(byte_ratio, digits=3)),
        ("closure / session, bytes over all cells", f"{total_closure / max(total_session, 1):.3f}"),
        ("import closure modules: median, p90",
         spread([len(c["import_closure"]) for c in cells])),
        ("whole-session cells (markers)", f"{sum(c['whole'] for c in live)}"),
        ("static analysis ms: median / p99", times("analysis_seconds")),
        ("draft analysis ms (worst prefix): median / p99", times("draft_seconds")),
        ("closure (server) ms: median / p99", times("closure_seconds")),
        ("grouping (worker) ms: median / p99", times("grouping_seconds")),
        ("grouping walks that hit the bound", f"{sum(c['bounded'] for c in cells)}"),
        ("precision, bytes touched / closure bytes: over all",
         f"{sum(c['touched_bytes'] for c in loaded) / max(total_closure, 1):.3f}"),
        ("precision per cell: median, p10",
         f"{statistics.median(precision_cells):.3f}, {quantile(precision_cells, 0.1):.3f}"),
        ("recall: misses (must be 0)", f"{len(misses)}"),
    ]
    for notebook, index, name in misses:
        rows.append((f"  miss: {notebook} cell {index}", name))
    return rows


def analysis_alone(notebooks: list[Path]) -> list[tuple[str, str]]:
    """Static analysis of every cell and of its drafts in this quiet process, best of 3: the
    audit's figures also carry the noise of a notebook running beside them."""
    from fabric.closure.static import analyze_uncached

    sources = [cell.source for nb in notebooks for cell in nbformat.read(nb, as_version=4).cells
               if cell.cell_type == "code"]

    def best(text: str) -> float:
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            analyze_uncached(text)
            runs.append((time.perf_counter() - start) * 1000)
        return min(runs)

    full = [best(s) for s in sources]
    drafts = [best(s[: len(s) * k // 4]) for s in sources for k in (1, 2, 3) if len(s) > 4]
    return [(f"analysis alone, {len(full)} cells, ms: median / p99 / max",
             f"{statistics.median(full):.2f} / {quantile(full, 0.99):.2f} / {max(full):.2f}"),
            ("drafts alone (1/4, 1/2, 3/4 typed), ms: median / p99 / max",
             f"{statistics.median(drafts):.2f} / {quantile(drafts, 0.99):.2f} / {max(drafts):.2f}")]


def big_states() -> list[tuple[str, str]]:
    """The grouping walk on big states, against pickling them (what a save costs anyway)."""
    import torch

    from fabric.closure import group_variables
    from fabric.snapshot import codec

    states = {
        "a model with 2000 parameter tensors": {
            "model": torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(1000)))},
        "a list of a million floats": {"floats": [float(i) for i in range(1_000_000)]},
        "100k small dicts": {"rows": [{"id": i, "tags": [i]} for i in range(100_000)]},
    }
    rows = []
    for label, ns in states.items():
        start = time.perf_counter()
        grouping = group_variables(ns, list(ns))
        walk = time.perf_counter() - start
        start = time.perf_counter()
        codec.dumps(ns, ns)
        pickling = time.perf_counter() - start
        bound = ", bound hit" if grouping.bounded else ""
        rows.append((f"grouping {label}",
                     f"{walk * 1000:.0f} ms ({walk / pickling:.2f}x its pickling{bound})"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--json", type=Path, help="Write every cell's audit here.")
    args = parser.parse_args()
    notebooks = args.notebooks or sorted(CORPUS.glob("*/*.ipynb"))
    with tempfile.TemporaryDirectory(prefix="llfabric-bench-") as workdir:
        results = audit_all(notebooks, Path(workdir))
    if args.json:
        args.json.write_text(json.dumps(results))
    rows = summarise(results) + analysis_alone(notebooks) + big_states()
    width = max(len(k) for k, _ in rows)
    print(f"\n{'closure analysis on ' + str(len(results)) + ' notebooks':<{width}}  value")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    sys.exit(1 if any(k.startswith("  miss") for k, _ in rows) else 0)


if __name__ == "__main__":
    main()

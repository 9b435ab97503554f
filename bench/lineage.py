"""How much of what a notebook cannot save can be recomputed, and at what cost.

Runs every notebook of a corpus through a server (warm workers, the default), cell by cell, then
reads each session's history: for every version that holds values the codec could not save, the
lineage plan (`fabric.snapshot.lineage`) says whether a fresh worker could rebuild them and what
the cells it would re-run took the first time. At the end of each notebook that still holds such
values, its worker is killed and one more cell measures the actual replay.

    PYTHONPATH=. .venv/bin/python bench/lineage.py CORPUS_DIR [--start N] [--limit N]
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from helpers import execute, open_session, serving
from notebook_compare import notebook_env

from fabric.notebook import read_notebook
from fabric.snapshot import Store, history, lineage


def _run(client, nb_path: Path, work: Path) -> tuple[str, int, str]:
    folder = work / nb_path.parent.name / nb_path.stem
    shutil.copytree(nb_path.parent, folder)
    session = open_session(client, folder)
    cells = [c.source for c in read_notebook(nb_path).cells if c.cell_type == "code"]
    for source in cells:
        try:
            execute(client, session, source)
        except Exception as exc:  # a cell the server refused: the run goes on, as a user would
            print(f"  {nb_path.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    measured = ""
    status = next(s for s in client.status().sessions if s.session == session)
    if status.pinned and status.worker:
        psutil.Process(status.worker).kill()
        time.sleep(0.5)
        reply, _ = execute(client, session, "pass")
        for notice in reply.get("notices", []):
            if notice["topic"] == "recomputed":
                measured = re.search(r"in ([\d.]+) s", notice["text"]).group(1)
            elif notice["topic"] == "lost":
                measured = "lost"
    return session, len(cells), measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--start", type=int, default=0, help="skip the first N notebooks")
    parser.add_argument("--limit", type=int, default=0)
    args = parser.parse_args()
    notebooks = sorted(args.corpus.glob("*/*.ipynb"))[args.start:][: args.limit or None]
    rows, reasons = [], collections.Counter()
    with tempfile.TemporaryDirectory() as tmp, \
            serving(Path(tmp) / "store", notebook_env()) as server, \
            server.client(timeout=600) as client:
        store = Store(server.store)
        for nb in notebooks:
            session, ncells, measured = _run(client, nb, Path(tmp) / "work")
            held, names, ok, costs = 0, set(), 0, []
            for _, manifest in history.log(store, session):
                _, unsaved = lineage.unsaved(store, manifest)
                if not unsaved or manifest.cell.get("source") == "pass":
                    continue
                held += 1
                names.update(unsaved)
                try:
                    plan = lineage.plan(store, manifest)
                    ok += 1
                    costs.append(plan.seconds)
                except lineage.NotReplayable as exc:
                    reasons[re.sub(r"cell \d+ ", "cell N ", exc.message)] += 1
            rows.append((f"{nb.parent.name}/{nb.stem}", ncells, held, len(names), ok,
                         statistics.median(costs) if costs else 0.0, max(costs, default=0.0),
                         measured))
            print(rows[-1], file=sys.stderr)
    print("| notebook | cells | versions holding unsaved values | distinct names | "
          "recomputable versions | median replay s (est.) | max replay s (est.) | "
          "measured replay at end s |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row)
              + " |")
    total = [sum(r[i] for r in rows) for i in (1, 2, 3, 4)]
    print(f"| total | {total[0]} | {total[1]} | {total[2]} | {total[3]} | | | |")
    print("\nwhy not recomputable (versions):")
    for why, n in reasons.most_common():
        print(f"  {n:4d}  {why}")


if __name__ == "__main__":
    main()

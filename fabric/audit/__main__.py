"""`python -m fabric.audit NOTEBOOK RESULT.json [--verify]`: audit a notebook in this process
and this directory (`audit_notebook` starts it in a fresh interpreter, in a copy of the
notebook's folder), writing every cell's audit to RESULT.json."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from ..notebook import read_notebook
from .recorder import Auditor


def main(argv: list[str] | None = None) -> None:
    """Run the audit the command line names, telling stderr of each cell as it ends."""
    args = sys.argv[1:] if argv is None else argv
    notebook, result, verify = Path(args[0]), Path(args[1]), "--verify" in args[2:]
    nb = read_notebook(notebook)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    audits = Auditor(verify).run(sources, on_cell=lambda a: print(
        f"cell {a.index}: {a.closure_variables}/{a.session_variables} variables, "
        f"{len(a.misses)} misses", file=sys.__stderr__, flush=True))
    result.write_text(json.dumps([asdict(a) for a in audits]))


if __name__ == "__main__":
    main()

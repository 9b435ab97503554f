"""The audit's report for people: a table of the cells' closures against their sessions, then
every cell that needed the whole session, looked up a name outside its closure, or left a
different state when it ran on its closure alone."""

from __future__ import annotations


def report(cells: list[dict]) -> str:
    """A table of the audit, one row per cell, then what went wrong."""
    lines = [f"{'cell':>4}  {'closure/session vars':>20}  {'closure/session MB':>20}  "
             f"{'touched':>7}  first line"]
    for c in cells:
        whole = "*" if c["whole"] else " "
        lines.append(
            f"{c['index']:>4}  {c['closure_variables']:>9}/{c['session_variables']:<9}{whole}  "
            f"{c['closure_bytes'] / 1e6:>9.2f}/{c['session_bytes'] / 1e6:<10.2f}  "
            f"{len(c['touched']):>7}  {c['head'][:40]}")
    lines.append("(* the cell defeats static analysis: its closure is the whole session)")
    for c in cells:
        if c["whole"]:
            lines.append(f"WHOLE cell {c['index']}: {c['forced_by']}")
        for name in c["misses"]:
            lines.append(f"MISS cell {c['index']}: looked up {name!r} outside its closure")
        for diff in c["variable_diffs"]:
            lines.append(f"DIFF cell {c['index']}: {diff}")
    return "\n".join(lines)

"""IPython's and the interpreter's bookkeeping in a cell's namespace: never session state, nor
what a debugger's variables panel shows of the cell's values."""

from __future__ import annotations

HIDDEN = frozenset({"In", "Out", "_ih", "_oh", "_dh", "_", "__", "___", "_i", "_ii", "_iii",
                    "get_ipython", "exit", "quit", "open", "__builtin__", "__builtins__",
                    "__name__", "__doc__", "__package__", "__loader__", "__spec__",
                    "__warningregistry__"})  # the warnings module keeps its "once" memory here


def is_bookkeeping(name: str) -> bool:
    return name in HIDDEN or _is_history_name(name)


def _is_history_name(name: str) -> bool:
    # _5, _i5, _ii, _iii: IPython's output and input history
    return name.startswith("_") and (name[1:].isdigit() or (name[1:2] == "i" and (
        name[2:].isdigit() or name[2:] in ("", "i", "ii"))))


"""State that lives in modules rather than variables, carried from cell to cell.

A fresh worker would otherwise start from its zygote's random state (the same numbers in every
session) and its own working directory. Only modules the session has already imported are read
or written: capturing must never import anything.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from typing import Any


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {"cwd": os.getcwd(), "random": random.getstate()}
    if (np := sys.modules.get("numpy")) is not None:
        state["numpy"] = np.random.get_state()
    if (torch := sys.modules.get("torch")) is not None:
        state["torch"] = torch.get_rng_state()
    if (mpl := sys.modules.get("matplotlib")) is not None:
        state["matplotlib"] = _matplotlib_state(mpl)
    return state


def _matplotlib_state(mpl: Any) -> dict[str, Any]:
    """The backend (unresolved: resolving it would import one) and the rcParams that changed."""
    original = mpl.rcParamsOrig
    changed = {k: v for k, v in mpl.rcParams.items()
               if k != "backend" and (k not in original or original[k] != v)}
    return {"backend": mpl.rcParams._get_backend_or_none(), "rc": changed}


def _restore_matplotlib(state: dict[str, Any]) -> None:
    import matplotlib as mpl

    backend = state["backend"]
    if backend is not None and backend != mpl.rcParams._get_backend_or_none():
        if "inline" in backend and (ip := _ipython()) is not None:
            ip.enable_matplotlib("inline")  # also hooks figure display after each cell
        else:
            mpl.use(backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated keys warn once, when the user set them
        mpl.rcParams.update(state["rc"])


def _ipython() -> Any:
    from IPython import get_ipython

    return get_ipython()


def restore(state: dict[str, Any]) -> None:
    if "cwd" in state:
        try:
            os.chdir(state["cwd"])
        except OSError as exc:
            print(f"llfabric: cannot return to {state['cwd']}: {exc}", file=sys.stderr)
    if "random" in state:
        random.setstate(state["random"])
    if "numpy" in state:
        import numpy as np  # the session had it; re-import costs nothing in a warm zygote

        np.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
    if "matplotlib" in state:
        _restore_matplotlib(state["matplotlib"])


def reseed() -> None:
    """Fresh entropy for a session's first worker, so forks of one zygote differ."""
    seed = int.from_bytes(os.urandom(8), "little")
    random.seed(seed)
    if (np := sys.modules.get("numpy")) is not None:
        np.random.seed(seed % 2**32)
    if (torch := sys.modules.get("torch")) is not None:
        torch.manual_seed(seed)

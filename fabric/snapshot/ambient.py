"""State that lives in modules rather than variables, carried from cell to cell.

A fresh worker would otherwise start from its zygote's random state (the same numbers in every
session) and its own working directory. Only modules the session has already imported are read
or written: capturing must never import anything.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {"cwd": os.getcwd(), "random": random.getstate()}
    if (np := sys.modules.get("numpy")) is not None:
        state["numpy"] = np.random.get_state()
    if (torch := sys.modules.get("torch")) is not None:
        state["torch"] = torch.get_rng_state()
    return state


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


def reseed() -> None:
    """Fresh entropy for a session's first worker, so forks of one zygote differ."""
    seed = int.from_bytes(os.urandom(8), "little")
    random.seed(seed)
    if (np := sys.modules.get("numpy")) is not None:
        np.random.seed(seed % 2**32)
    if (torch := sys.modules.get("torch")) is not None:
        torch.manual_seed(seed)

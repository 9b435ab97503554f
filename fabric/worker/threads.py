"""A worker's intra-op threads: as many as the cores its lease grants, never more.

Left alone, torch, OpenMP and BLAS each size their thread pools to all the host's cores, so two
sessions sharing a host's cores oversubscribe them: their threads spin against each other and a
cell runs many times slower than in a plain kernel. A worker sizes them when it takes its lease,
cheaply, since that is on every cell's path: libraries not loaded yet read the environment when
they load; pools already loaded (in the worker, or in the zygote it was forked from) are resized
through torch and threadpoolctl, which are never imported for a session that has not.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Read by OpenMP, OpenBLAS, MKL, numexpr and Accelerate when they load.
ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
       "VECLIB_MAXIMUM_THREADS")
# Modules that load native thread pools, which threadpoolctl finds among the loaded libraries.
NATIVE = frozenset({"numpy", "scipy", "torch", "sklearn", "numexpr", "cv2"})


def granted(cores: int, slots: int, configured: int = 0) -> int:
    """The threads of a lease: `configured`, else its slot's share of the host's cores."""
    return configured if configured > 0 else max(1, cores // max(1, slots))


def environ(count: int) -> dict[str, str]:
    return {name: str(count) for name in ENV}


_found: tuple[int, Any] | None = None  # (len(sys.modules), a ThreadpoolController) last scanned


def pools() -> Any:
    """threadpoolctl's view of the native pools loaded now; the scan of the loaded libraries is
    redone only once modules were imported since (a zygote's scan serves its forks)."""
    global _found
    if _found is None or _found[0] != len(sys.modules):
        from threadpoolctl import ThreadpoolController

        _found = (len(sys.modules), ThreadpoolController())
    return _found[1]


def warm() -> None:
    """Scan for native pools now, where modules that load them are imported."""
    if not NATIVE.isdisjoint(sys.modules):
        pools()


class Threads:
    def __init__(self) -> None:
        self.count = 0
        self._modules = 0  # len(sys.modules) when the pools were last sized: new ones may pool

    def grant(self, count: int) -> None:
        """Size the thread pools to `count` (at least 1)."""
        if count == self.count and len(sys.modules) == self._modules:
            return
        os.environ.update(environ(count))
        if not NATIVE.isdisjoint(sys.modules):
            pools().limit(limits=count)
            if (torch := sys.modules.get("torch")) is not None:
                torch.set_num_threads(count)
        self.count, self._modules = count, len(sys.modules)

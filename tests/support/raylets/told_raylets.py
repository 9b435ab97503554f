"""Raylets told every agent port, for test clusters on a loaded machine.

A raylet waits a fixed 15 s for each agent port it was not given (its agents choose and write
them down), and aborts when a loaded machine's slow Python start overruns that; Ray never gives
a raylet its dashboard agent's listen port, nor the autoscaler's nodes any. `tell()` makes the
raylets this process starts a stand-in (`raylet_stand_in`) that chooses every such port and
tells the raylet, its agents and its workers. This folder holds these two modules alone: Ray's
own processes (the `ray start` that starts a head, the autoscaler that starts nodes) import
them by PYTHONPATH.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

from ray._private import services
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

STAND_IN = '#!/bin/sh\nexec "{python}" "{program}" "{real}" "$@"\n'
REAL = services.RAYLET_EXECUTABLE


def tell() -> None:
    """Raylets this process starts from now on are told every agent port."""
    if services.RAYLET_EXECUTABLE != REAL:
        return
    folder = tempfile.mkdtemp(prefix="llf-raylet-")
    atexit.register(shutil.rmtree, folder, True)
    stand_in = Path(folder) / "raylet"
    program = Path(__file__).with_name("raylet_stand_in.py")
    stand_in.write_text(STAND_IN.format(python=sys.executable, program=program, real=REAL))
    stand_in.chmod(0o755)
    services.RAYLET_EXECUTABLE = str(stand_in)


def untell() -> None:
    services.RAYLET_EXECUTABLE = REAL


class Provider(FakeMultiNodeProvider):
    """Ray's fake multi-node provider, its nodes' raylets told (the autoscaler imports it)."""

    def __init__(self, provider_config: dict, cluster_name: str) -> None:
        tell()
        super().__init__(provider_config, cluster_name)


if __name__ == "__main__":  # `ray`'s command line, its raylets told: `python told_raylets.py start`
    from ray.scripts.scripts import main

    tell()
    sys.argv[0] = "ray"
    main()

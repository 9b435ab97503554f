"""Raylets told every agent port, for test clusters on a loaded machine.

Ray hands the dashboard agent its listen port but not the raylet, which waits a fixed 15 s for
the agent to write it down and aborts when a loaded machine's slow Python start overruns that.
`tell()` makes the raylets this process starts a stand-in that passes the port on from the
agent's command line. This folder holds this module alone: Ray's own processes (the `ray start`
that starts a head, the autoscaler that starts nodes) import it by PYTHONPATH.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

from ray._private import services
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

STAND_IN = """#!/usr/bin/env bash
for arg; do
  if [[ $arg =~ ^--dashboard_agent_command=.*--listen-port=([0-9]+) ]]; then
    exec {real} "$@" "--dashboard_agent_listen_port=${{BASH_REMATCH[1]}}"
  fi
done
exec {real} "$@"
"""
REAL = services.RAYLET_EXECUTABLE


def tell() -> None:
    """Raylets this process starts from now on are told their agent's listen port."""
    if services.RAYLET_EXECUTABLE != REAL:
        return
    folder = tempfile.mkdtemp(prefix="llf-raylet-")
    atexit.register(shutil.rmtree, folder, True)
    stand_in = Path(folder) / "raylet"
    stand_in.write_text(STAND_IN.format(real=REAL))
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

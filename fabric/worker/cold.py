"""A cold worker: a plain fresh process running the worker runtime, started when no zygote can
fork one (the base zygote died and is being rebuilt, or a fork failed). It pays an interpreter
start and its imports; the cell still runs.

    python -m fabric.worker.cold ENDPOINT STORE [SITE]

SITE: the site-packages of the session's environment, entered before anything runs.
"""

from __future__ import annotations

import sys

from . import env, runner
from .shell import make_shell
from .zygote import detach_from_cwd, die_with_parent, exit_after


def main() -> None:
    die_with_parent()  # as a forked worker dies with its zygote, this one dies with the server
    detach_from_cwd()
    if len(sys.argv) > 3:
        env.enter(sys.argv[3])
    exit_after(lambda: runner.main(make_shell(), sys.argv[1], sys.argv[2]))  # as a forked one


if __name__ == "__main__":
    main()

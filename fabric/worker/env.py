"""The session's environment inside a zygote or worker: its packages ahead of the server's,
and installs from a cell going into it (see `fabric.envs`).

A zygote of an environment enters it once (`enter`), before its imports; the workers it forks
inherit that. `%pip` runs the installer on the environment; `!pip install` is refused, since
it would install into the server's own packages, for every user of the host.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import site
import sys
from pathlib import Path
from typing import Any

VARIABLE = "LLFABRIC_ENV_DIR"  # the environment's folder, for the worker and its subprocesses
BASE_PTH = "_llfabric_base.pth"  # in an environment's site-packages: the server's, after it
SITE_DIRS = ("site-packages", "dist-packages")
NO_ENV = ("this session runs on the server's base environment, which cells do not change: "
          "make an environment with `llfabric env create NAME` and choose it with "
          "`%llfabric env NAME` (or `llfabric run --env NAME`), then `%pip install` again")
SHELL_SYNTAX = re.compile(r"[;&|<>`$(){}]")  # more than one pip command: not redirected
SHELL_PIP = re.compile(r"^\s*(\S*/)?(pip3?|python3?(\.\d+)?\s+-m\s+pip)\s+(install|uninstall)\b")


def enter(site_dir: str) -> None:
    """Put `site_dir` (and what its .pth files add) ahead of the server's packages."""
    before = list(sys.path)
    site.addsitedir(site_dir)
    added = [p for p in sys.path if p not in before and p != site_dir]
    sys.path[:] = _ahead_of_packages([site_dir, *added], before)
    os.environ[VARIABLE] = str(Path(site_dir).parents[2])  # ENV/lib/pythonX.Y/site-packages
    importlib.invalidate_caches()


def front() -> None:
    """Put the environment's paths ahead of the server's packages again, and drop other
    environments' (a session's saved sys.path, restored, may have been made in another)."""
    prefix = os.environ.get(VARIABLE)
    mine = [p for p in sys.path if prefix and p.startswith(prefix + os.sep)]
    others = [p for p in sys.path
              if p not in mine and not os.path.exists(os.path.join(p, BASE_PTH))]
    sys.path[:] = _ahead_of_packages(mine, others)


def _ahead_of_packages(mine: list[str], path: list[str]) -> list[str]:
    """`path` with `mine` just before its first site-packages: the standard library and the
    session's own folders still come first, as in a virtual environment."""
    at = next((i for i, p in enumerate(path) if os.path.basename(p) in SITE_DIRS), len(path))
    return [*path[:at], *mine, *path[at:]]


def installer(prefix: str, args: list[str]) -> list[str]:
    """The command that runs the installer's `args` (`install x`, `uninstall -y x`) on the
    environment in `prefix`: uv where it is on PATH, else pip."""
    python = os.path.join(prefix, "bin", "python")
    if uv := shutil.which("uv"):
        return [uv, "pip", *args[:1], "--python", python, *args[1:]]
    return [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check",
            *args]


def install_magics(shell: Any) -> None:
    """`%pip` on the session's environment; a plain `!pip install ARGS` is sent there too, one
    that does more in the shell (pipes, `&&`) is refused with the way to do it."""
    from IPython.core.error import UsageError

    system = shell.system

    def pip(line: str) -> None:
        prefix = os.environ.get(VARIABLE)
        args = shlex.split(line, comments=True)
        if not prefix:
            if args[:1] in (["install"], ["uninstall"]):
                raise UsageError(NO_ENV)
            system(shlex.join([sys.executable, "-m", "pip", *args]))
            return
        system(shlex.join(installer(prefix, args)))
        importlib.invalidate_caches()  # what it installed is importable in the next line

    def guarded(command: str) -> None:
        found = SHELL_PIP.match(command)
        if found is None:
            system(command)
        elif SHELL_SYNTAX.search(command) or not os.environ.get(VARIABLE):
            raise UsageError("`!pip install` would install into the server's own packages; "
                             "use `%pip install` (without `!`): it installs into the session's "
                             "environment")
        else:
            pip(command[found.start(4):])

    shell.register_magic_function(pip, "line", "pip")
    shell.system = guarded


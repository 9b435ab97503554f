"""Environments: a user's own packages, layered over the server's.

An environment is a virtual environment in `ENVS/USER/NAME` (`envs` setting, default the store's
`envs` folder), made by its user. Its site-packages holds what they installed; a `.pth` file in
it appends the server's own site-packages, so that the environment's interpreter, which the
installer drives, sees what the server has (torch is not copied per user) and its own packages
first.

Workers never run that interpreter: they fork from the server's zygotes, which put the
environment's site-packages ahead of the server's on `sys.path` (`worker.env`). So the base
zygote (the worker runtime: IPython, zmq) is shared by every environment, and only import
families, whose modules may differ between environments, are kept per environment. A package
the worker runtime itself imports (IPython and its dependencies) stays the server's version.

The installer is uv where it is on PATH, else pip (`pip --python ENV/bin/python`); either way
installs go into the environment, never into the server's own packages.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import AlreadyExists, EnvError, InvalidName, UnknownEnv
from .protocol import valid_session_name
from .worker.env import BASE_PTH, SITE_DIRS, installer

SITE = Path("lib") / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@dataclass(frozen=True)
class Env:
    """One environment: its name and folder."""

    name: str
    path: Path

    @property
    def site(self) -> Path:
        return self.path / SITE

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def generation(self) -> int:
        """Changes when a package is added, removed or replaced (the site folder's entries
        change): zygotes and templates built before it are stale. UnknownEnv once removed."""
        try:
            return os.stat(self.site).st_mtime_ns
        except FileNotFoundError:
            raise UnknownEnv(f"environment {self.name} was removed; choose another with "
                             f"`%llfabric env NAME`", env=self.name) from None

    def packages(self) -> dict[str, str]:
        """Name -> version of every distribution installed in the environment itself."""
        return packages_in(self.site)

    def install_command(self, args: list[str]) -> list[str]:
        """The command that runs the installer's `args` (`install x`, `uninstall -y x`) on
        this environment."""
        return installer(str(self.path), args)

    def install(self, args: list[str]) -> None:
        """Run the installer's `args` on this environment; EnvError with its output if it
        fails."""
        _run(self.install_command(args), f"{' '.join(args[:1])} in {self.name}")


def packages_in(site_dir: Path) -> dict[str, str]:
    """Name -> version of the distributions in `site_dir`, read from their `.dist-info`
    folder names (no metadata file is opened: it is on every commit's path)."""
    found = {}
    try:
        entries = os.listdir(site_dir)
    except FileNotFoundError:
        return {}
    for entry in entries:
        if entry.endswith(".dist-info"):
            name, _, version = entry[:-len(".dist-info")].partition("-")
            found[name.lower().replace("_", "-")] = version
    return dict(sorted(found.items()))


def differences(recorded: dict[str, str], now: dict[str, str]) -> dict[str, list[str | None]]:
    """Name -> [recorded version, version now] for each package that differs (None: absent)."""
    return {name: [recorded.get(name), now.get(name)] for name in sorted({*recorded, *now})
            if recorded.get(name) != now.get(name)}


class Envs:
    """The environments under `root`, one folder per user."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def _path(self, user: str, name: str) -> Path:
        if not valid_session_name(name):
            raise InvalidName(f"environment names are 1-128 characters of letters, digits, "
                              f"'-', '_' and '.', not {name!r}", name=name)
        return self.root / user / name

    def get(self, user: str, name: str) -> Env:
        path = self._path(user, name)
        if not (path / SITE).is_dir():
            raise UnknownEnv(f"{user} has no environment {name!r}; make it with `llfabric env "
                             f"create {name}`", env=name, user=user)
        return Env(name, path)

    def list(self, user: str) -> list[Env]:
        folder = self.root / user
        names = sorted(os.listdir(folder)) if folder.is_dir() else []
        return [Env(n, folder / n) for n in names if (folder / n / SITE).is_dir()]

    def create(self, user: str, name: str, requirements: Path | None = None) -> Env:
        """A new environment over the server's packages; with `requirements`, installed."""
        path = self._path(user, name)
        if path.exists():
            raise AlreadyExists(f"environment {name!r} exists", env=name)
        try:
            path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise EnvError(f"cannot make environment {name} in {path.parent} ({exc.strerror}); "
                           "set `envs` to a folder where you can", env=name) from exc
        env = Env(name, path)
        try:
            _run([sys.executable, "-m", "venv", "--without-pip", str(path)], f"make {name}")
            if not env.site.is_dir():
                raise EnvError(f"the virtual environment {path} has no {SITE}", env=name)
            base = [p for p in (*site.getsitepackages(), *sys.path)
                    if os.path.basename(p) in SITE_DIRS]
            (env.site / BASE_PTH).write_text("".join(f"{p}\n" for p in dict.fromkeys(base)))
            if requirements is not None:
                env.install(["install", "-r", str(requirements)])
        except BaseException:  # no half-made environment is left to be chosen
            shutil.rmtree(path, ignore_errors=True)
            raise
        return env

    def remove(self, user: str, name: str) -> None:
        shutil.rmtree(self.get(user, name).path)


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode:
        raise EnvError(f"could not {what}: {(done.stderr or done.stdout).strip()[-2000:]}",
                       command=command[:6])


def describe_differences(differ: dict[str, list[str | None]], env: str | None) -> str:
    """What a checkout tells its user of packages that differ from those its version ran
    with, and the cell line that restores them."""
    lines = [f"  {name}: {was or 'absent'} then, {now or 'absent'} now"
             for name, (was, now) in differ.items()]
    wanted = [f"{name}=={was}" for name, (was, _) in differ.items() if was]
    gone = [name for name, (was, _) in differ.items() if not was]
    fix = " and ".join(part for part in (
        f"`%pip install {' '.join(wanted)}`" if wanted else "",
        f"`%pip uninstall -y {' '.join(gone)}`" if gone else "") if part)
    return (f"llfabric: environment {env}'s packages differ from those this version ran with:\n"
            + "\n".join(lines) + f"\nto restore them, run {fix} in a cell")

"""A worker's environment: where its packages go on sys.path, and which shell lines are
installs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fabric.snapshot import ambient
from fabric.worker import env


def test_an_environment_goes_just_ahead_of_the_servers_packages(tmp_path: Path,
                                                                monkeypatch) -> None:
    mine = tmp_path / "mine" / "lib" / "python3" / "site-packages"
    other = tmp_path / "other" / "lib" / "python3" / "site-packages"
    for site in (mine, other):
        site.mkdir(parents=True)
        (site / env.BASE_PTH).write_text("")
    base = ["/work", "/py/lib/python3.11", "/venv/lib/python3.11/site-packages"]
    monkeypatch.setattr(sys, "path", list(base))
    monkeypatch.setenv(env.VARIABLE, "")  # recorded, so that what `enter` sets is undone
    monkeypatch.delenv(env.VARIABLE)
    env.enter(str(mine))
    assert sys.path == [*base[:2], str(mine), base[2]]
    # a session's saved sys.path, made in another environment, restored here
    ambient.restore({"path": [*base[:2], str(other), base[2], "/added"]})
    env.front()
    assert sys.path == [*base[:2], str(mine), base[2], "/added"]
    assert env.os.environ[env.VARIABLE] == str(tmp_path / "mine")


@pytest.mark.parametrize(("line", "install"), [
    ("pip install x", True), ("pip3 uninstall -y x", True),
    ("/venv/bin/python -m pip install x", True), ("python3.11 -m pip install x", True),
    ("pip list", False), ("echo pip install", False), ("pipx install x", False),
])
def test_which_shell_lines_are_installs(line: str, install: bool) -> None:
    assert bool(env.SHELL_PIP.match(line)) is install

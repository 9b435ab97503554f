"""The environment workers start with (`worker_env`): what the operator lists, never the rest of
the server's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.errors import ConfigError
from fabric.pool.environ import worker_environ

SERVER = {"AWS_SECRET_ACCESS_KEY": "x", "HTTP_PROXY": "http://proxy:3128", "HOME": "/root",
          "PATH": "/opt/secret-tools/bin:/usr/bin"}


def test_a_host_of_several_users_passes_nothing_of_the_servers_unlisted() -> None:
    clean = worker_environ("", separate=True, server=SERVER)
    assert "AWS_SECRET_ACCESS_KEY" not in clean and "HTTP_PROXY" not in clean
    assert clean["PATH"].split(":")[0] == str(Path(sys.executable).parent)  # `!python` is ours
    assert "/opt/secret-tools/bin" not in clean["PATH"]
    assert clean["LANG"] == "C.UTF-8"
    assert set(clean) <= {"PATH", "LANG", "HOME", "USER", "LOGNAME", "PYTHONPATH"}


def test_the_operator_lists_names_and_values() -> None:
    clean = worker_environ("HTTP_PROXY, ABSENT  MODE=fast", separate=True, server=SERVER)
    assert clean["HTTP_PROXY"] == "http://proxy:3128" and clean["MODE"] == "fast"
    assert "ABSENT" not in clean and "AWS_SECRET_ACCESS_KEY" not in clean


def test_a_single_users_workers_get_their_environment_unless_the_operator_lists() -> None:
    assert worker_environ("", separate=False, server=SERVER) == SERVER
    assert worker_environ("* MODE=fast", separate=True, server=SERVER) == {**SERVER,
                                                                           "MODE": "fast"}
    listed = worker_environ("HTTP_PROXY", separate=False, server=SERVER)
    assert "AWS_SECRET_ACCESS_KEY" not in listed and listed["HTTP_PROXY"] == SERVER["HTTP_PROXY"]


@pytest.mark.parametrize("entry", ["1BAD", "A-B", "=x", "$(id)"])
def test_an_entry_that_names_no_variable_is_refused(entry: str) -> None:
    with pytest.raises(ConfigError, match="worker_env"):
        worker_environ(entry, separate=True, server=SERVER)


def test_the_worker_runtime_starts_in_a_clean_environment() -> None:
    """Whether llfabric is installed or run from a source checkout (PYTHONPATH), a process
    with nothing of the server's environment but the clean one imports the worker runtime."""
    clean = worker_environ("", separate=True, server=dict(os.environ))
    started = subprocess.run([sys.executable, "-c", "import fabric.worker.runner"], cwd="/",
                             env=clean, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr

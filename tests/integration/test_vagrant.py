"""The GPU VM's Vagrantfile (vagrant/) is valid, and refuses a malformed GPU address.

Skips where Vagrant is not installed (`apt-get install vagrant`). Without the vagrant-libvirt
plugin Vagrant has no provider to validate the libvirt settings against, so they are ignored
(`--ignore-provider`) and the rest is validated.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

VAGRANT_DIR = Path(__file__).resolve().parents[2] / "vagrant"

pytestmark = pytest.mark.skipif(shutil.which("vagrant") is None, reason="vagrant is not installed")


@pytest.fixture(scope="module")
def vagrant(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """`vagrant validate`, with the libvirt settings ignored where no provider can load."""
    tried = validate(["vagrant", "validate"], tmp_path_factory.mktemp("vagrant"), None)
    if "No usable default provider" in tried.stderr:
        return ["vagrant", "validate", "--ignore-provider"]
    return ["vagrant", "validate"]


def _environ(tmp_path: Path, gpu: str | None = None) -> dict[str, str]:
    # Vagrant keeps state under VAGRANT_HOME and the project's .vagrant/: both go to tmp_path
    environ = {**os.environ, "VAGRANT_HOME": str(tmp_path / "home"),
               "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot"), "VAGRANT_CHECKPOINT_DISABLE": "1"}
    environ.pop("LLFABRIC_GPU_PCI", None)
    return environ | ({"LLFABRIC_GPU_PCI": gpu} if gpu is not None else {})


def validate(command: list[str], tmp_path: Path, gpu: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=VAGRANT_DIR, env=_environ(tmp_path, gpu),
                          capture_output=True, text=True, timeout=60)


def test_the_vagrantfile_validates(vagrant: list[str], tmp_path: Path) -> None:
    for gpu in (None, "0000:65:00.0"):
        result = validate(vagrant, tmp_path, gpu)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "validated successfully" in result.stdout


def test_a_malformed_gpu_address_is_refused(vagrant: list[str], tmp_path: Path) -> None:
    result = validate(vagrant, tmp_path, "65:00.0")
    assert result.returncode != 0
    assert "not a PCI address like 0000:65:00.0" in result.stdout + result.stderr

"""What an operator runs on a host: `llfabric doctor` (can it serve, and what to fix) and
`llfabric service install` (a systemd unit that systemd itself accepts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fabric import service
from fabric.doctor import clashing_distributions
from fabric.errors import ConfigError

LLFABRIC = [sys.executable, "-m", "cli.main"]
ROOT = Path(__file__).resolve().parents[2]
CHECKS = ("import name", "kernel", "criu", "pycriu", "llfabric-init", "store disk", "store dir",
          "runtime dir", "capabilities")


def _llfabric(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "LLFABRIC_RUNTIME_DIR": str(tmp_path / "run"), **env}
    return subprocess.run([*LLFABRIC, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=environ)


def _lines(output: str) -> dict[str, str]:
    """Each check's verdict, by its name."""
    verdicts = {}
    for line in output.splitlines():  # "VERDICT  NAME  DETAIL", names padded to one width
        verdict, rest = line[:4].strip(), line[6:]
        for name in (*CHECKS, "nvidia", "nvidia driver"):
            if rest.startswith(name + " ") and verdict in ("ok", "WARN", "FAIL", "skip"):
                verdicts.setdefault(name, verdict)
    return verdicts


def test_doctor_gives_every_check_a_verdict_and_says_the_host_serves(tmp_path: Path) -> None:
    done = _llfabric(tmp_path, "doctor", "--store", str(tmp_path / "store"))
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = _lines(done.stdout)
    assert set(CHECKS) <= set(verdicts), done.stdout
    assert "nvidia" in verdicts or "nvidia driver" in verdicts  # skipped on a CPU host
    assert verdicts["store dir"] == "ok" and verdicts["kernel"] == "ok"
    assert done.stdout.rstrip().endswith("this host can serve")


def test_doctor_fails_a_store_others_can_write_into_and_says_how_to_fix_it(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o777)
    done = _llfabric(tmp_path, "doctor", "--store", str(store))
    assert done.returncode == 1
    assert _lines(done.stdout)["store dir"] == "FAIL"
    assert f"fix: chown to this user and chmod 0700 {store}" in done.stdout
    assert "this host cannot serve" in done.stdout


def test_doctor_warns_without_criu_and_names_the_fix(tmp_path: Path) -> None:
    done = _llfabric(tmp_path, "doctor", "--store", str(tmp_path / "store"),
                     LLFABRIC_CRIU=str(tmp_path / "no-criu"))
    assert done.returncode == 0  # zygotes still serve
    assert _lines(done.stdout)["criu"] == "WARN"
    assert "fix: install CRIU 4.x" in done.stdout and "`make criu`" in done.stdout


def test_the_name_clash_check_finds_another_distribution_with_a_fabric_package(
        tmp_path: Path) -> None:
    assert clashing_distributions() == []  # this venv: llfabric's `fabric` alone
    for name, files in (("fabric", "fabric/__init__.py"), ("llfabric", "fabric/__init__.py"),
                        ("fabricate", "fabricate/__init__.py")):
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "RECORD").write_text(f"{files},,\n")
    assert clashing_distributions([str(tmp_path)]) == ["fabric"]


def test_service_install_writes_a_unit_systemd_accepts(tmp_path: Path) -> None:
    unit = tmp_path / "llfabric.service"
    done = _llfabric(tmp_path, "service", "install", "--unit", str(unit),
                     "--bind", "tcp://0.0.0.0:5555")
    assert done.returncode == 0, done.stderr
    assert "systemctl daemon-reload && systemctl enable --now llfabric" in done.stdout
    text = unit.read_text()
    assert "Restart=on-failure" in text and "RuntimeDirectory=llfabric" in text
    assert " serve --store /var/lib/llfabric --bind tcp://0.0.0.0:5555\n" in text
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze to verify the unit with")
    verified = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                              text=True, timeout=60)
    assert verified.returncode == 0, verified.stderr


def test_a_unit_quotes_what_needs_it_and_refuses_a_line_break() -> None:
    text = service.unit("/opt/llfabric/bin/llfabric", store="/data/my store")
    assert 'ExecStart=/opt/llfabric/bin/llfabric serve --store "/data/my store"\n' in text
    assert "StateDirectory" not in text  # the store is the operator's, not systemd's
    with pytest.raises(ConfigError, match="line break"):
        service.unit("/opt/llfabric/bin/llfabric", bind="tcp://x\nExecStartPre=/bin/sh")

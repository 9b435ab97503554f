"""Where CRIU and llfabric-init are found: LLFABRIC_CRIU and LLFABRIC_INIT, a checkout's builds,
PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabric.pool import criu


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_the_configured_binary_wins_over_a_build_and_path(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    configured = _executable(tmp_path / "opt" / "criu")
    built = _executable(tmp_path / "checkout" / "criu")
    monkeypatch.setenv("PATH", str(_executable(tmp_path / "bin" / "criu").parent))
    assert criu.locate(str(configured), "criu", built) == configured


def test_a_checkout_build_comes_before_path(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    built = _executable(tmp_path / "checkout" / "criu")
    monkeypatch.setenv("PATH", str(_executable(tmp_path / "bin" / "criu").parent))
    assert criu.locate("", "criu", built) == built


def test_installed_without_a_checkout_it_is_found_on_path(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = _executable(tmp_path / "bin" / "llfabric-init")
    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}{os.pathsep}{on_path.parent}")
    assert criu.locate("", "llfabric-init", tmp_path / "absent") == on_path
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert criu.locate("", "llfabric-init", tmp_path / "absent") is None


def test_a_wrong_setting_finds_nothing_rather_than_another(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    built = _executable(tmp_path / "checkout" / "criu")
    monkeypatch.setenv("PATH", str(_executable(tmp_path / "bin" / "criu").parent))
    plain = tmp_path / "plain"
    plain.write_text("not executable")
    for wrong in (tmp_path / "absent", plain, tmp_path):
        assert criu.locate(str(wrong), "criu", built) is None
    monkeypatch.setenv("LLFABRIC_CRIU", str(tmp_path / "absent"))
    assert criu.criu_binary() is None
    if os.geteuid() == 0:  # below root, unavailable() stops at that
        assert criu.unavailable() == f"LLFABRIC_CRIU={tmp_path / 'absent'} is not an " \
                                     "executable file"


def test_the_settings_name_the_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    init, binary = _executable(tmp_path / "init"), _executable(tmp_path / "criu")
    monkeypatch.setenv("LLFABRIC_CRIU", str(binary))
    monkeypatch.setenv("LLFABRIC_INIT", str(init))
    assert (criu.criu_binary(), criu.init_binary()) == (binary, init)

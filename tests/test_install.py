"""An install that is not a checkout: the wheel `python -m build` makes (from its sdist, so the
sdist is complete too), installed into a fresh virtual environment, runs `llfabric --version`,
`doctor` and `demo` with nothing of the checkout on its path.

The venv is made without system site-packages and gets the wheel alone (`--no-deps`); the
dependencies come from this project's venv through a plain path line in a .pth file (which adds
that folder but runs none of its .pth files, so its editable llfabric stays out of sight), and
`pip check` proves that they satisfy every requirement the wheel declares. Installing them from
an index would prove no more about the wheel and would need the network."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from wheels import wheel

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
LABEXTENSION = Path("share") / "jupyter" / "labextensions" / "llfabric-lab"

pytestmark = pytest.mark.install


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    """This venv's pip acting on `venv`, blind to the checkout (PYTHONPATH would show it the
    checkout's llfabric.egg-info as installed)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                 "--disable-pip-version-check", *args], cwd=venv.parent, env=env)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from this checkout installed."""
    folder = tmp_path_factory.mktemp("install")
    built = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                  str(folder / "dist"), str(ROOT)], cwd=folder)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel_path,) = (folder / "dist").glob("llfabric-*.whl")
    venv = folder / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=folder)
    assert made.returncode == 0, made.stderr
    installed = _pip(venv, "install", "-q", "--no-deps", str(wheel_path))
    assert installed.returncode == 0, installed.stderr
    site = Path(_python(venv, "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _python(venv: Path, code: str) -> str:
    done = _run([str(venv / "bin" / "python"), "-c", code], cwd=venv, env=_clean(venv))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _clean(venv: Path, **more: str) -> dict[str, str]:
    """An environment with nothing of the checkout or of this venv: no PYTHONPATH, no
    LLFABRIC_* setting, the system's PATH, and a store and runtime dir of the install's own."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
            "LLFABRIC_STORE": str(venv.parent / "store"),
            "LLFABRIC_RUNTIME_DIR": str(venv.parent / "run"), **more}


def _llfabric(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return _run([str(venv / "bin" / "llfabric"), *args], cwd=venv.parent, env=_clean(venv))


def test_the_wheel_installs_the_package_its_helper_and_the_lab_extension(venv: Path) -> None:
    places = _python(venv, "import cli, fabric, fabric.pool.criu as c; "
                           "print(fabric.__file__, cli.__file__, c.init_binary())").split()
    assert all(Path(place).is_relative_to(venv) for place in places), places
    assert os.access(places[2], os.X_OK)  # the workers' init, compiled into the wheel
    assert (venv / LABEXTENSION / "package.json").is_file()
    assert list((venv / LABEXTENSION / "static").glob("remoteEntry.*.js"))
    checked = _pip(venv, "check")
    assert not [line for line in checked.stdout.splitlines()
                if line.lower().startswith("llfabric ")], checked.stdout


def test_version_comes_from_the_package_metadata(venv: Path) -> None:
    done = _llfabric(venv, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"llfabric {VERSION}", done.stdout


def test_doctor_says_what_the_host_still_needs_then_a_name_clash(venv: Path) -> None:
    done = _llfabric(venv, "doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[1]: line for line in done.stdout.splitlines()
             if line[:4].strip() in ("ok", "WARN", "FAIL", "skip")}
    assert lines["import"].startswith("ok")
    assert lines["llfabric-init"].startswith("ok") and str(venv) in lines["llfabric-init"]
    if lines["criu"].startswith("WARN"):  # no CRIU 4 on the system's PATH
        assert "install CRIU 4.x" in done.stdout and "https://criu.org" in done.stdout
    assert "driver 570" in done.stdout or "nvidia driver" in done.stdout
    # another distribution's `fabric` package (as Fabric, the SSH tool, installs) lands in ours
    other = wheel(venv.parent / "other", "sshfabric", "1.0", "", module="fabric/connection.py")
    installed = _pip(venv, "install", "-q", "--no-deps", str(other))
    assert installed.returncode == 0, installed.stderr
    done = _llfabric(venv, "doctor")
    assert done.returncode == 1
    assert "FAIL  import name" in done.stdout and "sshfabric" in done.stdout
    assert "virtual environment of its own" in done.stdout
    _pip(venv, "uninstall", "-y", "-q", "sshfabric")


def test_demo_runs_the_notebook_shipped_in_the_package(venv: Path) -> None:
    done = _llfabric(venv, "demo", "--think-time", "0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "test accuracy" in done.stdout and "demo finished" in done.stdout


def test_demo_without_torch_says_what_to_install(tmp_path: Path) -> None:
    hidden = "import sys; sys.modules['torch'] = None; from cli.main import main; main()"
    done = _run([sys.executable, "-c", hidden, "demo"], cwd=tmp_path)
    assert done.returncode == 1
    assert "the demo notebook needs torch: pip install torch" in done.stderr

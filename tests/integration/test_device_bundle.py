"""The GPU test machine's one command, proven here without a GPU: `make device-bundle` builds what
that machine lacks within what one call there can take, and `bench/device_check.sh --dry-run`
installs the bundle into a clean CPython 3.12 folder with --no-index and runs every step but
CUDA. The GPU page (docs/user/gpus.md) gives the command a call runs; it must fit the call's limits.

Skips when the bundle cannot be built because the package index cannot be reached.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import require_criu

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "build" / "device-bundle"
SCRIPT = ROOT / "bench" / "device_check.sh"
MIB = 1 << 20
GLIBC = ("libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "ld-linux", "linux-vdso")


@pytest.fixture(scope="module")
def bundle() -> Path:
    built = subprocess.run(["make", "-s", "device-bundle"], cwd=ROOT, capture_output=True,
                           text=True, timeout=900)
    if built.returncode and "the package index cannot be reached" in built.stderr:
        pytest.skip("the package index cannot be reached: no bundle can be built")
    assert built.returncode == 0, built.stdout + built.stderr
    return BUNDLE


def the_call() -> dict[str, str]:
    """The `key: value` lines of the GPU page's call block: command, carry, timeout_s."""
    page = (ROOT / "docs" / "user" / "gpus.md").read_text()
    block = re.search(r"```text\n(command:.*?)```", page, re.S)
    assert block, "docs/user/gpus.md has no ```text block with the call"
    return dict(line.split(":", 1) for line in block[1].splitlines() if ":" in line)


def travelling_bytes(carry: list[str]) -> int:
    """What a call sends: the checkout's tracked and unignored files, and the carried paths."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    files = [ROOT / name for name in listed if name and (ROOT / name).is_file()]
    for path in carry:
        files += [p for p in (ROOT / path).rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files)


def test_the_documented_call_fits_the_machine_s_limits(bundle: Path) -> None:
    call = {key.strip(): value.strip() for key, value in the_call().items()}
    assert "bench/device_check.sh" in call["command"] and len(call["command"]) < 2000
    carry = call["carry"].split()
    assert 1 <= len(carry) <= 8 and "build/device-bundle" in carry
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    for path in carry:  # built here, sent beside the checkout, never committed
        assert (ROOT / path).exists(), path
        assert not [name for name in tracked if name.startswith(f"{path}/")], path
    assert travelling_bytes(carry) < 64 * MIB
    budget = int(re.search(r"deadline=\$\(\(SECONDS \+ \$\{DEADLINE:-(\d+)\}\)\)",
                           SCRIPT.read_text())[1])
    assert budget + 60 <= int(call["timeout_s"]) <= 600  # the script ends before the call does


def test_the_bundle_holds_what_the_machine_lacks_and_nothing_it_has(bundle: Path) -> None:
    listed = (ROOT / "scripts" / "device-machine.txt").read_text().splitlines()
    machine_has = {name for name in listed if name and not name.startswith("#")}
    wheels = {w.name.split("-")[0].lower().replace("_", "-"): w.name
              for w in (bundle / "wheels").glob("*.whl")}
    assert {"llfabric", "pyzmq", "ipython", "nbformat"} <= wheels.keys()
    assert not wheels.keys() & machine_has
    assert "cp312" in wheels["pyzmq"] and "manylinux" in wheels["pyzmq"]
    # CRIU finds every library it links beyond glibc in the bundle, not on this system
    linked = subprocess.run(["ldd", str(bundle / "criu" / "libexec" / "criu")], capture_output=True,
                            text=True, check=True,
                            env={**os.environ, "LD_LIBRARY_PATH": str(bundle / "criu" / "lib")})
    own = [line.split("=>")[1].split()[0] for line in linked.stdout.splitlines()
           if "=>" in line and not line.strip().startswith(GLIBC)]
    assert own and all(Path(lib).parent == bundle / "criu" / "lib" for lib in own), linked.stdout
    version = subprocess.run([str(bundle / "criu" / "bin" / "criu"), "--version"],
                             capture_output=True, text=True, check=True).stdout
    assert "Version: 4.1.1" in version
    assert (bundle / "criu" / "python" / "pycriu" / "rpc_pb2.py").is_file()
    assert os.access(bundle / "bin" / "llfabric-init", os.X_OK)


def test_the_dry_run_installs_the_bundle_and_runs_every_step_but_cuda(
        bundle: Path, tmp_path: Path) -> None:
    require_criu("the dry run's CRIU")
    run = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OUT": str(tmp_path),
                                           "PYTHON": sys.executable})
    results = (tmp_path / "device_check.txt").read_text()
    assert run.returncode == 0, results + run.stderr
    lines = {line.split(":", 1)[0]: line for line in results.splitlines() if ":" in line}
    assert re.match(r"install: ok, \d+ wheels into \S+ for CPython 3\.12$", lines["install"])
    assert lines["requirements"].startswith("requirements: all met for CPython 3.12")
    assert "/venv/bin/python)" in lines["python"]  # only the machine's packages and the bundle's
    assert lines["runtime"].split()[1] in ("gVisor", "Firecracker", "unknown")
    assert lines["criu check"].startswith("criu check: passed (4.1.1")
    assert f"({bundle.resolve() / 'criu' / 'python' / 'pycriu'})" in lines["pycriu"]
    assert lines["templates"] == "templates: available"  # the bundle's criu and init
    # ...with which a real server's workers come from templates, as they will on the GPU
    assert re.match(r"without CUDA \(exit 0\): =+ \d+ passed in ", lines["without CUDA (exit 0)"])
    assert re.search(r"^=+ .*\d+ skipped.* =+$", results, re.M)  # the suite ran, CUDA skipped
    assert "skipped: no NVIDIA GPU" in results  # bench/gpu.py


def test_without_the_checkpoint_api_the_suite_leaves_out_exactly_the_tests_that_need_it() -> None:
    """The dry run has no GPU to take that path: check its -k keywords against the tests."""
    keywords = re.search(r'NEEDS_CHECKPOINT="([^"]+)"', SCRIPT.read_text())[1].split(" or ")
    for module in ("tests/integration/test_gpu_cells.py", "tests/pool/test_gpu.py"):
        for node in ast.parse((ROOT / module).read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                needs = "find_driver" in ast.unparse(node)
                left_out = any(word in node.name for word in keywords)
                assert needs == left_out, f"{module}::{node.name}"


def test_the_dry_run_s_python_imports_only_what_the_machine_or_the_bundle_has(
        bundle: Path, tmp_path: Path) -> None:
    """Its stand-in for the machine's python3 fails on an import where that machine would."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "device_venv.py"), str(tmp_path / "v"),
                    str(ROOT / "scripts" / "device-machine.txt"),
                    *map(str, (bundle / "wheels").glob("*.whl"))], check=True,
                   capture_output=True)

    def imports(module: str) -> bool:
        return subprocess.run([str(tmp_path / "v" / "bin" / "python"), "-c", f"import {module}"],
                              capture_output=True).returncode == 0

    assert imports("zmq") and imports("IPython") and imports("msgpack") and imports("pytest")
    assert not imports("jupyter_client") and not imports("nbclient")  # here, not there

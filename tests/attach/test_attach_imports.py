"""What the attached kernel's extension costs its start: `import fabric.attach` loads only what
the first request needs, on top of what ipykernel has loaded already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# ipykernel's own (pwd, tomllib and zmq's submodules among them) besides llfabric's
ALLOWED = {"fabric", "xxhash", "zmq", "pwd", "tomllib"}
PROBE = """
import json, sys
import ipykernel.ipkernel, ipykernel.kernelapp  # loaded before the kernel loads its extensions
before = set(sys.modules)
import fabric.attach
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_import_loads_only_what_the_first_request_needs() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(REPO)}).stdout
    loaded = json.loads(out)
    packages = {name.split(".")[0] for name in loaded}
    assert packages <= ALLOWED, f"import fabric.attach loads {sorted(packages - ALLOWED)}"
    assert "nbformat" not in packages and "jsonschema" not in packages  # seconds each

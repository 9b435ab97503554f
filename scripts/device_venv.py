"""Make a venv that sees, of this interpreter's installed distributions, only those named.

    python scripts/device_venv.py DIR NAMES_FILE... [WHEEL...]

Each NAMES_FILE holds distribution names, one a line (# comments); each WHEEL adds its own
distribution's name. The venv's site-packages links to the top-level modules (and metadata) of
those distributions as this interpreter has them installed, editable installs left out, so a
program run by DIR/bin/python (its subprocesses too) imports what a machine with just those
packages would, and fails where that machine would: bench/device_check.sh --dry-run stands in
for the GPU machine with it.
"""

from __future__ import annotations

import sys
import sysconfig
import venv
from importlib import metadata
from pathlib import Path


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def names(paths: list[str]) -> set[str]:
    found = set()
    for path in paths:
        if path.endswith(".whl"):
            found.add(normalise(Path(path).name.split("-")[0]))
        else:
            lines = Path(path).read_text().splitlines()
            found |= {normalise(line) for line in lines if line and not line.startswith("#")}
    return found


def make(target: Path, wanted: set[str]) -> int:
    """Create the venv at `target`; return how many distributions it sees."""
    venv.create(target, with_pip=False, symlinks=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(target),
                                                    "platbase": str(target)}))
    linked = 0
    for dist in metadata.distributions():
        if normalise(dist.metadata["Name"]) not in wanted or dist.files is None:
            continue
        if '"editable": true' in (dist.read_text("direct_url.json") or ""):
            continue  # a checkout's own code: the program finds it on PYTHONPATH instead
        linked += 1
        for top in {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    return linked


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    count = make(Path(sys.argv[1]), names(sys.argv[2:]))
    print(f"{sys.argv[1]}: a venv that sees {count} of this Python's distributions")

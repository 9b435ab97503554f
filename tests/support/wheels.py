"""Tiny wheels written directly (a zip with its metadata), for installs with no network."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def wheel(folder: Path, name: str, version: str, source: str, module: str = "") -> Path:
    """A pure-Python wheel of one module, `name` (or the file `module`, e.g. pkg/mod.py),
    whose code is `source`; its path."""
    dist = f"{name}-{version}"
    files = {
        module or f"{name}.py": source,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                   "Tag: py3-none-any\n",
    }
    record = [f"{path},sha256={_digest(text)},{len(text.encode())}" for path, text in files.items()]
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def _digest(text: str) -> str:
    raw = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

"""A remote tier that misbehaves on demand: the fsspec protocol ``flaky://``, this machine's file
system behind switches a test turns while a server runs.

``flaky:///some/folder`` keeps its files in /some/folder, as ``file://`` would. The control file
that ``FSSPEC_FLAKY_CONTROL`` names (fsspec's own configuration of a protocol's options) is read
at each call, and says how the remote behaves now (`Flaky.set`):

- ``latency``: seconds each call waits before it is served (a slow remote);
- ``fail``: the exception each write raises, by name: ``PermissionError``, ``TimeoutError`` or
  ``OSError`` (a remote that refuses writes, or whose writes time out);
- ``capacity``: the bytes its folder may hold; a write past them raises ENOSPC (a full remote);
- ``hold``: each write waits until it is turned off (a remote that hangs); the file
  ``<control>.held`` tells a test that one waits;
- ``only``: the writes the switches above apply to are those whose path holds this text (the
  claims of heads' moves, ``/after/``, say); the others behave.

No control file: it behaves. fsspec finds the protocol as it finds any package's, by the entry
point of ``flaky_remote-0.dist-info`` beside this module (tests/support is on the path of the
tests and, through `Flaky.env`, of the servers they start).
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem

SUPPORT = Path(__file__).resolve().parent
FAILURES = {"PermissionError": PermissionError, "TimeoutError": TimeoutError, "OSError": OSError}


class FlakyFileSystem(LocalFileSystem):
    protocol = ("flaky",)

    def __init__(self, control: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.control = Path(control) if control else None

    def _how(self) -> dict[str, Any]:
        if self.control is None:
            return {}
        try:
            return json.loads(self.control.read_text())
        except FileNotFoundError:
            return {}

    def _gate(self, path: str, write: bool, nbytes: int = 0) -> None:
        """Misbehave as the control file says, before a call on `path` is served."""
        how = self._how()
        time.sleep(float(how.get("latency", 0)))
        if not write or how.get("only", "") not in str(path):
            return
        if how.get("hold") and self.control is not None:
            held = self.control.with_name(self.control.name + ".held")
            held.touch()
            while self._how().get("hold"):  # a remote that hangs until the test lets it go
                time.sleep(0.02)
            held.unlink(missing_ok=True)
            how = self._how()
        if failure := how.get("fail"):
            raise FAILURES[failure](f"the flaky remote refuses writes ({failure})")
        if "capacity" in how and _used(Path(how["root"])) + nbytes > int(how["capacity"]):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), how["root"])

    # reads
    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._gate(path, False)
        return super().info(path, **kwargs)

    def ls(self, path: str, detail: bool = False, **kwargs: Any) -> Any:
        self._gate(path, False)
        return super().ls(path, detail, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        self._gate(path, False)
        return super().cat_file(path, start, end, **kwargs)

    # writes
    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self._gate(path, True, len(value))
        super().pipe_file(path, value, mode, **kwargs)

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        if mode[0] in "wxa":  # a claim (its bytes are few: a full remote refuses it still)
            self._gate(path, True)
        return super()._open(path, mode, block_size, **kwargs)

    def mv(self, path1: str, path2: str, recursive: bool = True, **kwargs: Any) -> None:
        self._gate(path2, True)
        super().mv(path1, path2, recursive, **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self._gate(path, True)
        super().makedirs(path, exist_ok)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        self._gate(path, True)
        super().rm(path, recursive, maxdepth)


def _used(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


class Flaky:
    """A flaky remote in `folder` for a test: its URL, what a server needs to reach it, and its
    switches."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.control = folder.with_name(folder.name + ".control")
        self.url = f"flaky://{folder}"
        folder.mkdir(parents=True, exist_ok=True)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (this process's environment) with what a server needs to reach the remote."""
        base = dict(os.environ if base is None else base)
        path = os.pathsep.join(p for p in (str(SUPPORT), base.get("PYTHONPATH", "")) if p)
        return {**base, "PYTHONPATH": path, "FSSPEC_FLAKY_CONTROL": str(self.control)}

    def set(self, **how: object) -> None:
        """Behave as `how` says from the next call on (nothing: behave)."""
        tmp = self.control.with_name(self.control.name + ".tmp")
        tmp.write_text(json.dumps({"root": str(self.folder), **how}))
        tmp.replace(self.control)

    @property
    def holding(self) -> bool:
        """Whether a write waits on `hold` now."""
        return self.control.with_name(self.control.name + ".held").exists()

    def files(self, under: str) -> set[str]:
        """The names of the files it holds under `under` (blobs, manifests, ...)."""
        return {p.name for p in (self.folder / under).rglob("*")
                if p.is_file() and not p.name.startswith(".tmp-")}
